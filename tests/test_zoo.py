"""The zoo (``benchmarks/zoo.py``): its catalogue and its judgement, and a sample of it run
through the real ``reproci run``: transformers architectures across heads (causal LM, masked
LM, seq2seq, image classification, CTC), a diffusers UNet with an EMA checkpointed as extra
state, peft LoRA and a Lightning module with a DataModule, each A = B = C with no warning,
and two planted bugs (a private RNG in a collator, a clock seed) with their verdicts.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from .helpers import ROOT

ZOO_FILE = ROOT / "benchmarks" / "zoo.py"


@pytest.fixture(scope="module")
def zoo():
    spec = importlib.util.spec_from_file_location("zoo_under_test", ZOO_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def catalog(zoo):
    return zoo.catalog()


def test_the_catalogue_covers_the_heads_and_names_every_factory(zoo, catalog):
    """At least 45 transformers architectures across every head, names unique, and every
    entry's factory is defined in its file (the name reproci will give it is FILE.factory)."""
    names = [e.name for e in catalog]
    assert len(names) == len(set(names))
    hf = [e for e in catalog if e.library == "transformers" and not e.planted]
    assert len(hf) >= 45, len(hf)
    heads = {e.head for e in hf}
    assert {"causal LM", "masked LM", "seq2seq LM", "sequence classification", "image classification", "CTC",
            "audio classification", "contrastive image-text"} <= heads, heads
    for e in catalog:
        module, _, factory = e.name.partition(".")
        source = e.file.read_text()
        assert e.file.is_file() and (f"def {factory}(" in source or f'"{factory}":' in source), e.name
    for family in ("text", "seq2seq", "vision", "audio", "diffusers", "peft", "lightning"):
        assert any(e.planted and e.family == family for e in catalog), f"no planted bug for {family}"
    assert set(zoo.SAMPLE) <= set(names)


def test_only_takes_full_names_short_names_and_modules(zoo, catalog):
    assert [e.name for e in zoo.select(catalog, ["gpt2"], False)] == ["hf_text.gpt2"]
    assert [e.name for e in zoo.select(catalog, ["hf_text.gpt2"], False)] == ["hf_text.gpt2"]
    assert all(e.name.startswith("hf_audio.") for e in zoo.select(catalog, ["hf_audio"], False))
    with pytest.raises(SystemExit, match="no entry named"):
        zoo.select(catalog, ["no_such_model"], False)


def test_an_architecture_passes_only_when_its_runs_agree_with_no_warning(zoo):
    """NEW with "A = B = C" passes; a warning or a note in the message, a warning about the
    model on stderr, or any other verdict fails. A planted bug passes with its expected verdict."""
    e = zoo.Entry("hf_text.gpt2", "text", "GPT2LMHeadModel", "causal LM", "transformers")
    agree = "A = B = C: bitwise reproducible, resume exact; no golden file for image local"
    assert zoo.judge(e, {"verdict": "NEW", "message": agree}, "").ok
    assert zoo.judge(e, {"verdict": "PASS", "message": agree}, "").ok
    assert not zoo.judge(e, {"verdict": "NEW", "message": agree + "; warning: epoch 2 visits ..."}, "").ok
    assert not zoo.judge(e, {"verdict": "NEW", "message": agree + "; note: k falls in epoch 0"}, "").ok
    assert not zoo.judge(e, {"verdict": "NEW", "message": agree}, "warning: hf_text.gpt2: something\n").ok
    assert not zoo.judge(e, {"verdict": "RESUME_BROKEN", "message": "A = B, C differs"}, "").ok
    assert not zoo.judge(e, None, "").ok
    planted = zoo.Entry("planted.vit_clock_seed", "vision", "ViT", "image classification", "transformers",
                        "NONDETERMINISTIC", "clock seed")
    assert zoo.judge(planted, {"verdict": "NONDETERMINISTIC", "message": "A ≠ B from step 0"}, "").ok
    assert not zoo.judge(planted, {"verdict": "NEW", "message": agree}, "").ok


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """One run of the zoo's sample (one ``reproci run``): its JSON summary and its output."""
    pytest.importorskip("transformers")
    pytest.importorskip("pytorch_lightning")
    work = tmp_path_factory.mktemp("zoo")
    p = subprocess.run([sys.executable, str(ZOO_FILE), "--sample", "--work", str(work / "runs"),
                        "--json", str(work / "zoo.json")], capture_output=True, text=True, timeout=900)
    assert (work / "zoo.json").is_file(), p.stdout + p.stderr
    return {"summary": json.loads((work / "zoo.json").read_text()), "stdout": p.stdout, "code": p.returncode}


def by_name(sample: dict, name: str) -> dict:
    return next(e for e in sample["summary"]["entries"] if e["name"] == name)


@pytest.mark.slow
def test_the_sample_architectures_pass(zoo, sample):
    """Every architecture of the sample is A = B = C with no warning (an entry whose library
    is not installed is skipped, and says so)."""
    clean = [e for e in sample["summary"]["entries"] if e["expect"] == "PASS"]
    assert len(clean) >= 5
    failed = [(e["name"], e["verdict"], e["message"]) for e in clean if not e["ok"]]
    assert not failed, failed
    ran = [e for e in clean if not e["skipped"]]
    assert all(e["verdict"] == "NEW" and e["message"].startswith("A = B = C") for e in ran), ran
    n = len(ran)
    assert f"{n}/{n} architectures PASS" in sample["stdout"], sample["stdout"]
    assert sample["code"] == 0, sample["stdout"]


@pytest.mark.slow
def test_a_private_rng_in_the_collator_is_resume_broken(sample):
    """BERT whose collator drops tokens from its own random.Random(seed), not in the checkpoint:
    the resumed run draws from a fresh one and its batches differ after the resume point."""
    e = by_name(sample, "planted.bert_collator_rng")
    assert e["verdict"] == "RESUME_BROKEN" and e["ok"], e["message"]
    assert "C" in e["message"], e["message"]


@pytest.mark.slow
def test_a_clock_seed_is_nondeterministic(sample):
    """peft LoRA on GPT-2 after torch.manual_seed(time.time_ns()): A and B start from other
    adapter weights."""
    e = by_name(sample, "lora.gpt2_lora_clock_seed")
    if e["skipped"]:
        pytest.skip(e["skipped"])
    assert e["verdict"] == "NONDETERMINISTIC" and e["ok"], e["message"]
    assert "planted bugs get their verdict" in sample["stdout"]
