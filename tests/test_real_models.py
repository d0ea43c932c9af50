"""Real Hugging Face models (``tests/plugins/real_libs.py``) through the real CLI: the
collators' ``BatchEncoding`` batches, their masking RNGs, worker processes, Adafactor,
``enable_full_determinism`` and a weight EMA, each as users write them, a buggy twin beside
the correct version.

All models go through one ``reproci run`` (two at a time), 12 steps resumed at 6: 4 batches
an epoch, so the resume falls in the middle of the second epoch. With no golden recorded, a
model whose runs agree and resume exactly is NEW with "A = B = C" (the determinism stage's
PASS); PASS proper needs a golden (``reproci/golden/drift.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import PLUGINS, Cli, installed, model_entry

installed("transformers", "pytorch_lightning")  # a skip only where one is not installed at all

pytestmark = pytest.mark.slow
PLUGIN = PLUGINS / "real_libs.py"
LIGHTNING = PLUGINS / "lightning_module.py"
FACTORIES = ("gpt2_clm", "bert_mlm", "bert_mlm_private_generator", "bert_mlm_private_generator_fixed",
             "bert_mlm_persistent_workers", "bert_mlm_workers_fixed", "t5_adafactor", "gpt2_full_determinism",
             "gpt2_ema_unsaved", "gpt2_ema_declared", "gpt2_adapted_full_determinism", "wav2vec2_ctc")
AGREE = "A = B = C: bitwise reproducible, resume exact"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run of every factory: its results document and its run directory."""
    cli = Cli(tmp_path_factory.mktemp("real-libs"))
    refs = [a for f in FACTORIES for a in ("-m", f"{PLUGIN}:{f}")] + ["-m", f"{LIGHTNING}:build"]
    p = cli("run", "--steps", "12", "--resume-at", "6", "--jobs", "2", *refs)
    assert (cli.cwd / "results" / "latest.json").is_file(), p.stdout + p.stderr
    doc = cli.latest()
    return {"doc": doc, "dir": cli.cwd / "results" / doc["run_id"]}


def entry(run: dict, factory: str) -> dict:
    return model_entry(run["doc"], f"{PLUGIN.stem}.{factory}")  # a plugin FILE.py:factory is named FILE.factory


def record_a(run: dict, factory: str) -> dict:
    return json.loads((Path(run["dir"]) / entry(run, factory)["records"]["A"]).read_text())


def assert_agrees(m: dict) -> None:
    assert m["verdict"] == "NEW" and m["message"].startswith(AGREE), (m["model"], m["verdict"], m["message"])


@pytest.mark.parametrize("factory", ["gpt2_clm", "bert_mlm"])
def test_collator_batches_are_checksummed_and_the_model_passes(run, factory):
    """A user trains GPT-2 (causal LM collator) or BERT (masking from torch's global RNG) with
    the collator's own BatchEncoding batches, a UserDict rather than a dict: the batches are
    checksummed like any dict of tensors (not all zero), so the runs pass with no false
    warning such as "epoch 2 visits the samples in the same order as epoch 1"."""
    m = entry(run, factory)
    assert_agrees(m)
    assert "warning" not in m["message"], m["message"]
    checksums = record_a(run, factory)["batch_fingerprints"]
    assert len(checksums) == 12 and any(checksums), checksums


def test_a_ctc_model_trains_under_strict_mode(run):
    """Wav2Vec2ForCTC computes its loss inside ``torch.backends.cudnn.flags(enabled=False)``,
    which reads the legacy TF32 getter and sets cuDNN's flags for the block: under strict mode
    the run trains, agrees and resumes exactly, with no control taken for switched off."""
    m = entry(run, "wav2vec2_ctc")
    assert_agrees(m)
    assert record_a(run, "wav2vec2_ctc")["controls"]["switched_off"] == []


def test_masking_from_the_collators_private_generator_is_resume_broken_until_exposed(run):
    """A user passes ``seed=`` to DataCollatorForLanguageModeling, so masking draws from a
    generator inside the collate_fn that the checkpoint does not hold: the resumed run masks
    differently from step 7, and the message points at the collate_fn. Exposing that
    generator through get_extra_state/set_extra_state makes the resume exact."""
    broken = entry(run, "bert_mlm_private_generator")
    assert broken["verdict"] == "RESUME_BROKEN", broken["message"]
    assert broken["evidence"]["comparison"] == "A vs C" and broken["evidence"]["step"] == 7
    assert broken["evidence"]["cause"] == "data", broken["evidence"]
    assert broken["evidence"]["data"] == "contents@2", broken["evidence"]  # other masks, not another order
    assert "different batch contents: other samples, or other augmentation or masking draws" in broken["message"]
    assert ("likely cause: loader.collate_fn.generator (torch.Generator) differs between A and C at step 6"
            in broken["message"]), broken["message"]
    assert_agrees(entry(run, "bert_mlm_private_generator_fixed"))


def test_masking_in_persistent_workers_is_resume_broken_and_fresh_seeded_workers_pass(run):
    """A user masks in 2 DataLoader workers kept alive across epochs (persistent_workers=True):
    their RNG carries over from epoch 1, which a resume in epoch 2 cannot replay, and the
    message says to set persistent_workers=False. Workers started afresh each epoch, seeded
    from the loader generator, resume exactly."""
    broken = entry(run, "bert_mlm_persistent_workers")
    assert broken["verdict"] == "RESUME_BROKEN", broken["message"]
    assert broken["evidence"]["step"] == 7 and broken["evidence"]["cause"] == "data", broken["evidence"]
    assert broken["evidence"]["data"] == "contents@2", broken["evidence"]
    assert "persistent_workers=False" in broken["message"], broken["message"]
    assert_agrees(entry(run, "bert_mlm_workers_fixed"))


def test_t5_with_adafactor_resumes_exactly(run):
    """A user trains T5 with DataCollatorForSeq2Seq and Adafactor (relative steps), whose state
    holds a Python step count and an RMS tensor it replaces every step instead of updating
    it in place: the checkpoint restores that state, and the runs pass."""
    assert_agrees(entry(run, "t5_adafactor"))


def test_enable_full_determinism_is_not_taken_for_switching_determinism_off(run):
    """A user calls ``transformers.enable_full_determinism`` in the factory, which sets
    CUBLAS_WORKSPACE_CONFIG=":16:8", a deterministic setting like the harness's own: the
    runs pass, not NONDETERMINISTIC for a control "switched off"."""
    assert_agrees(entry(run, "gpt2_full_determinism"))


def test_the_libraries_own_switches_through_the_adapters_coexist_with_reproci(run):
    """TrainingArguments(full_determinism=True) through hf_setup passes. (Its Lightning twin,
    lightning_setup(deterministic=True) in ``lightning_module.py:adapted``, runs with the same
    steps and resume point in tests/test_adapters.py, which holds it to PASS against a golden
    with no warning: the same model is not run twice.)"""
    assert_agrees(entry(run, "gpt2_adapted_full_determinism"))


def test_an_undeclared_weight_ema_is_resume_broken_and_a_declared_one_passes(run):
    """A user keeps a weight EMA (torch AveragedModel) updated in loss_fn and evaluates it in
    eval_fn: left out of the checkpoint, a resumed run starts a fresh EMA and its ema_loss
    differs, which the message names. Declared as TrainSetup.state_modules, the EMA is
    checkpointed and restored, and the runs pass."""
    broken = entry(run, "gpt2_ema_unsaved")
    assert broken["verdict"] == "RESUME_BROKEN", broken["message"]
    assert "ema_loss" in broken["message"], broken["message"]
    assert_agrees(entry(run, "gpt2_ema_declared"))


def test_a_hand_adapted_lightning_module_passes(run):
    """A user's LightningModule, its training_step as the loss and configure_optimizers' dict
    form unpacked by hand, seeded with Lightning's seed_everything: reproducible and resume exact."""
    m = model_entry(run["doc"], "lightning_module")
    assert_agrees(m)
    assert "warning" not in m["message"], m["message"]


def test_a_timm_ema_left_out_of_the_checkpoint_is_resume_broken(tmp_path):
    """timm's ModelEmaV3 beside a tiny ViT: undeclared, the resumed run's EMA starts afresh and
    its held-out loss differs; declared in TrainSetup.state_modules, the resume is exact."""
    try:
        import timm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or torchvision's operator error on import
        pytest.skip(f"timm cannot be imported here ({type(e).__name__}: {str(e)[:80]}): it needs torchvision, "
                    "whose wheels on the package index are CUDA builds that do not import beside CPU torch")
    cli = Cli(tmp_path)
    timm_plugin = PLUGINS / "timm_models.py"
    cli("run", "--steps", "12", "--resume-at", "6", "-m", f"{timm_plugin}:vit_ema_unsaved",
        "-m", f"{timm_plugin}:vit_ema_declared", "-m", f"{timm_plugin}:vit_cosine_after_step")
    doc = cli.latest()
    broken = model_entry(doc, "timm_models.vit_ema_unsaved")
    assert broken["verdict"] == "RESUME_BROKEN" and "ema_loss" in broken["message"], broken["message"]
    assert_agrees(model_entry(doc, "timm_models.vit_ema_declared"))
    assert_agrees(model_entry(doc, "timm_models.vit_cosine_after_step"))  # timm's scheduler, stepped as timm steps it
