"""The zoo: every architecture reproci is known to check, through the real ``reproci run``.

    python benchmarks/zoo.py                        # everything (about 20 minutes on 2 cores)
    python benchmarks/zoo.py --sample               # a small fixed subset, about 2 minutes
    python benchmarks/zoo.py --only gpt2 hf_audio.whisper planted.vit_clock_seed
    python benchmarks/zoo.py --list                 # the entries, what each must give

Each entry is a plugin factory in ``benchmarks/zoo_models/``: a transformers architecture built
from its config class with tiny sizes and random init (no downloads: synthetic token ids,
random images and waveforms), trained through ``reproci.adapters.hf.hf_setup`` with the
collator a Trainer script uses; diffusers UNets with an EMA; peft LoRA; Lightning modules with
DataModules and torchmetrics; timm (skipped where timm cannot be imported). Planted bugs sit
beside them, each with the verdict it must get.

Many models share one ``reproci run`` (``-m a -m b ...``): the fork server's start and the
orchestrator's own start are paid once per invocation, and ``--jobs`` keeps every slot busy
across models. An architecture PASSes when its runs agree and resume exactly ("A = B = C"; with
no golden recorded that is verdict NEW) with no warning in its message or on stderr; a planted
bug passes when it gets its expected verdict. Prints "N/M architectures PASS", every failure
with its verdict message from ``results.json``, and writes a JSON summary (``--json``). Exit
code 0 when every architecture passes and every planted bug gets its verdict, else 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "zoo_models"
AGREE = "A = B = C"
CLEAN = "PASS"  # what an architecture must give: A = B = C (PASS, or NEW with no golden) and no warning


@dataclass
class Entry:
    name: str  # reproci's name for the plugin: FILE.factory
    family: str  # text, seq2seq, vision, audio, multimodal, diffusers, peft, lightning, timm
    architecture: str  # the model class
    head: str
    library: str
    expect: str = CLEAN  # CLEAN, or the verdict a planted bug must get
    bug: str = ""  # what was planted
    requires: tuple[str, ...] = ("transformers",)
    import_check: bool = False  # import the requirements in a subprocess (an import may fail, not only be missing)

    @property
    def file(self) -> Path:
        return MODELS / f"{self.name.split('.')[0]}.py"

    @property
    def ref(self) -> str:
        module, _, factory = self.name.partition(".")
        return f"{MODELS / module}.py:{factory}"

    @property
    def planted(self) -> bool:
        return self.expect != CLEAN


@dataclass
class Outcome:
    entry: str
    ok: bool
    verdict: str | None = None
    message: str = ""
    seconds: float | None = None  # worker seconds: runs A + B + C
    skipped: str | None = None
    warnings: list[str] = field(default_factory=list)  # stderr lines about the model
    notices: list[str] = field(default_factory=list)  # the message's "notice:" parts (they do not fail it)


RESUME_BROKEN, NONDETERMINISTIC = "RESUME_BROKEN", "NONDETERMINISTIC"
FAMILIES = {"hf_text": "text", "hf_seq2seq": "seq2seq", "hf_vision": "vision", "hf_audio": "audio",
            "hf_multimodal": "multimodal"}


def catalog() -> list[Entry]:
    """Every zoo entry, in table order."""
    entries = []
    saved = list(sys.path)
    sys.path[:0] = [str(ROOT), str(MODELS)]  # as the worker loads a plugin file: its folder on the path
    try:
        for module, family in FAMILIES.items():
            specs = importlib.import_module(module).SPECS
            entries += [Entry(f"{module}.{name}", family, spec["model"], spec["head"], "transformers")
                        for name, spec in specs.items()]
    finally:
        sys.path[:] = saved
    d, p, lt = ("diffusers", "transformers"), ("peft", "transformers"), ("pytorch_lightning", "torchmetrics")
    entries += [
        Entry("diffusion.unet2d_ddpm_ema", "diffusers", "UNet2DModel", "denoising (DDPM, EMAModel)", "diffusers", requires=d),
        Entry("diffusion.unet2d_condition_vpred", "diffusers", "UNet2DConditionModel", "denoising (v-prediction, EMAModel)",
              "diffusers", requires=d),
        Entry("lora.gpt2_lora", "peft", "GPT2LMHeadModel", "causal LM (LoRA)", "peft", requires=p),
        Entry("lora.llama_lora", "peft", "LlamaForCausalLM", "causal LM (LoRA)", "peft", requires=p),
        Entry("lora.bert_lora_cls", "peft", "BertForSequenceClassification", "sequence classification (LoRA)", "peft",
              requires=p),
        Entry("lightning_zoo.cnn_datamodule", "lightning", "LightningModule (CNN)", "image classification",
              "pytorch-lightning, torchmetrics", requires=lt),
        Entry("lightning_zoo.transformer_datamodule", "lightning", "LightningModule (nn.TransformerEncoder)",
              "sequence classification", "pytorch-lightning", requires=lt),
        Entry("lightning_zoo.torchmetrics_loss", "lightning", "LightningModule (MLP)", "regression (Pearson r in the loss)",
              "pytorch-lightning, torchmetrics", requires=lt),
        Entry("timm_zoo.vit_tiny", "timm", "VisionTransformer", "image classification", "timm", requires=("timm",),
              import_check=True),
        Entry("timm_zoo.resnet10t", "timm", "ResNet", "image classification", "timm", requires=("timm",),
              import_check=True),
        Entry("planted.wav2vec2_ema_declared", "audio", "Wav2Vec2ForCTC", "CTC (EMA in state_modules)", "transformers"),
        # planted bugs: one per family
        Entry("planted.bert_collator_rng", "text", "BertForMaskedLM", "masked LM", "transformers", RESUME_BROKEN,
              "private random.Random(seed) in the collator"),
        Entry("planted.bart_collator_rng", "seq2seq", "BartForConditionalGeneration", "seq2seq LM", "transformers",
              RESUME_BROKEN, "private random.Random(seed) in the collator"),
        Entry("planted.vit_clock_seed", "vision", "ViTForImageClassification", "image classification", "transformers",
              NONDETERMINISTIC, "torch.manual_seed(time.time_ns()) in the factory"),
        Entry("planted.wav2vec2_ema_unsaved", "audio", "Wav2Vec2ForCTC", "CTC", "transformers", RESUME_BROKEN,
              "weight EMA outside the checkpoint"),
        Entry("diffusion.unet2d_ema_unsaved", "diffusers", "UNet2DModel", "denoising (DDPM, EMAModel)", "diffusers",
              RESUME_BROKEN, "EMAModel outside the checkpoint", requires=d),
        Entry("lora.gpt2_lora_clock_seed", "peft", "GPT2LMHeadModel", "causal LM (LoRA)", "peft", NONDETERMINISTIC,
              "torch.manual_seed(time.time_ns()) in the factory", requires=p),
        Entry("lightning_zoo.cnn_metric_unsaved", "lightning", "LightningModule (CNN)", "image classification",
              "pytorch-lightning, torchmetrics", "NEW", "torchmetrics Accuracy only logged, its state outside every "
              "checkpoint: A = B = C, with a warning that says persistent(True)", requires=lt),
        Entry("lightning_zoo.cnn_collate_rng_seeded", "lightning", "LightningModule (CNN)", "image classification",
              "pytorch-lightning", RESUME_BROKEN, "private random.Random(seed) in the DataModule's collate_fn",
              requires=lt),
        Entry("lightning_zoo.cnn_collate_rng_unseeded", "lightning", "LightningModule (CNN)", "image classification",
              "pytorch-lightning", NONDETERMINISTIC, "unseeded random.Random() in the DataModule's collate_fn",
              requires=lt),
    ]
    return entries


# A handful of diverse, cheap entries and two planted bugs: the test suite's sample
# (tests/test_zoo.py), using only transformers, accelerate, Lightning, diffusers, peft, torchmetrics.
SAMPLE = ("hf_text.gpt2", "hf_seq2seq.t5", "hf_vision.resnet", "hf_audio.wav2vec2_ctc",
          "diffusion.unet2d_ddpm_ema", "lora.gpt2_lora", "lightning_zoo.cnn_datamodule",
          "planted.bert_collator_rng", "lora.gpt2_lora_clock_seed")


def select(entries: list[Entry], only: list[str] | None, sample: bool) -> list[Entry]:
    """``--only`` takes full names (``hf_text.gpt2``), short names where unique (``gpt2``), or
    a module (``hf_audio``) for all of its entries."""
    if sample:
        only = list(SAMPLE) + list(only or [])
    if not only:
        return entries
    picked: list[Entry] = []
    for want in only:
        hits = [e for e in entries if want in (e.name, e.name.split(".")[0], e.name.split(".", 1)[1])]
        if not hits:
            raise SystemExit(f"zoo: no entry named {want!r}; `python benchmarks/zoo.py --list` lists them")
        short = [e for e in hits if e.name.split(".", 1)[1] == want and e.name != want]
        if len(short) > 1:
            raise SystemExit(f"zoo: {want!r} is ambiguous ({', '.join(e.name for e in short)}): give the full name")
        picked += [e for e in hits if e not in picked]
    return picked


def unavailable(entries: list[Entry]) -> dict[str, str]:
    """Entry name -> why it is skipped: a required package that is missing, or fails to import."""
    why: dict[str, str] = {}
    checked: dict[str, str | None] = {}
    for e in entries:
        for module in e.requires:
            if module not in checked:
                checked[module] = None if importlib.util.find_spec(module) else f"{module} is not installed"
                if checked[module] is None and e.import_check:
                    p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
                    if p.returncode:
                        last = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
                        checked[module] = f"{module} cannot be imported here ({last})"
            if checked[module]:
                why[e.name] = checked[module]  # type: ignore[assignment]
                break
    for name, reason in why.items():
        if reason.startswith("timm cannot be imported"):
            why[name] = (reason + ": timm imports torchvision, whose wheels on the package index are CUDA builds "
                         "that do not import beside a CPU torch")
    return why


def reproci_run(entries: list[Entry], work: Path, steps: int, resume_at: int, jobs: int | None,
                timeout: int) -> tuple[dict[str, Any] | None, str, int, float]:
    """One ``reproci run`` over ``entries``: its results document, stderr, exit code and seconds."""
    cmd = [sys.executable, "-m", "reproci.cli", "run", "--steps", str(steps), "--resume-at", str(resume_at),
           "--no-ci", "--timeout", str(timeout), "--results-dir", str(work / "results"),
           "--goldens-dir", str(work / "no-goldens")]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    for e in entries:
        cmd += ["-m", e.ref]
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]), COLUMNS="200",
               CI="")
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    found = re.search(r"^results: (.+)$", p.stdout, re.M)
    doc = json.loads(Path(found.group(1).strip()).read_text()) if found and Path(found.group(1).strip()).is_file() else None
    return doc, p.stderr, p.returncode, seconds


def judge(entry: Entry, model: dict[str, Any] | None, stderr: str) -> Outcome:
    """Whether the entry gave what it must, from its results.json entry and the run's stderr."""
    if model is None:
        return Outcome(entry.name, False, None, "no result: the reproci run did not finish (see its stderr)")
    verdict, message = model.get("verdict"), model.get("message", "")
    runs = model.get("runs") or {}
    seconds = round(sum(r.get("wall_s") or 0.0 for r in runs.values()), 1) if runs else model.get("seconds")
    said = [line for line in stderr.splitlines()
            if line.lower().startswith("warning") and (entry.name in line or entry.ref in line)]
    notices = re.findall(r"notice: (.*?)(?=; (?:no golden|note:|warning:|notice:)|$)", message, re.S)
    if entry.planted:
        return Outcome(entry.name, verdict == entry.expect, verdict, message, seconds, warnings=said, notices=notices)
    ok = (verdict in ("PASS", "NEW") and message.startswith(AGREE) and "warning:" not in message
          and "note:" not in message and not said)
    return Outcome(entry.name, ok, verdict, message, seconds, warnings=said, notices=notices)


def run(entries: list[Entry], steps: int, resume_at: int, jobs: int | None, chunk: int, timeout: int,
        work: Path, progress: bool = True) -> tuple[list[Outcome], list[dict[str, Any]]]:
    skip = unavailable(entries)
    outcomes = {e.name: Outcome(e.name, True, None, "", None, skipped=skip[e.name]) for e in entries if e.name in skip}
    todo = [e for e in entries if e.name not in skip]
    invocations = []
    for i in range(0, len(todo), chunk or len(todo) or 1):
        group = todo[i:i + (chunk or len(todo))]
        if progress:
            print(f"zoo: reproci run with {len(group)} models ({i + len(group)}/{len(todo)}) ...", file=sys.stderr,
                  flush=True)
        doc, stderr, code, seconds = reproci_run(group, work, steps, resume_at, jobs, timeout)
        by_name = {m["model"]: m for m in (doc or {}).get("models", [])}
        for e in group:
            outcomes[e.name] = judge(e, by_name.get(e.name), stderr)
        invocations.append({"models": [e.name for e in group], "exit_code": code, "seconds": round(seconds, 1),
                            "results": str(Path(doc["run_id"])) if doc else None,
                            "stderr_tail": stderr[-2000:] if doc is None else ""})
        if progress:
            bad = [e.name for e in group if not outcomes[e.name].ok]
            print(f"zoo:   exit {code} in {seconds:.0f} s" + (f"; not as expected: {', '.join(bad)}" if bad else ""),
                  file=sys.stderr, flush=True)
    return [outcomes[e.name] for e in entries], invocations


def report(entries: list[Entry], outcomes: list[Outcome]) -> tuple[str, bool]:
    """The summary lines: N/M architectures PASS, planted bugs, skips, every failure with its message."""
    pairs = list(zip(entries, outcomes))
    clean = [(e, o) for e, o in pairs if not e.planted and not o.skipped]
    planted = [(e, o) for e, o in pairs if e.planted and not o.skipped]
    lines = [f"{sum(o.ok for _, o in clean)}/{len(clean)} architectures PASS"]
    if planted:
        lines.append(f"{sum(o.ok for _, o in planted)}/{len(planted)} planted bugs get their verdict")
    for e, o in pairs:
        if o.skipped:
            lines.append(f"skipped {e.name}: {o.skipped}")
    for e, o in pairs:
        if o.ok and not e.planted and o.notices:
            lines.append(f"notice {e.name}: " + "; ".join(o.notices))
    for e, o in pairs:
        if not o.ok:
            want = f"expected {e.expect}" if e.planted else "expected A = B = C with no warning"
            extra = "".join(f"\n    stderr: {w}" for w in o.warnings)
            lines.append(f"FAIL {e.name} ({e.architecture}, {e.head}): {o.verdict} ({want}): {o.message}{extra}")
    return "\n".join(lines), all(o.ok for o in outcomes)


def markdown(entries: list[Entry], outcomes: list[Outcome]) -> str:
    """The table of docs/zoo.md."""
    rows = ["| entry | architecture | head | library | expected | verdict | seconds |", "|---|---|---|---|---|---|---|"]
    for e, o in zip(entries, outcomes):
        verdict = "skipped" if o.skipped else (o.verdict or "no result")
        if not o.skipped and not o.ok:
            verdict = f"**{verdict}** (fails)"
        elif not e.planted and not o.skipped:
            verdict = f"A = B = C ({verdict})" + (" + notice" if o.notices else "")
        expected = "A = B = C" if not e.planted else f"{e.expect} ({e.bug})"
        secs = "" if o.seconds is None else f"{o.seconds:.1f}"
        rows.append(f"| `{e.name}` | {e.architecture} | {e.head} | {e.library} | {expected} | {verdict} | {secs} |")
    return "\n".join(rows) + "\n"


def from_summary(path: Path, table: Path | None) -> int:
    """The report and the table of an earlier run, from its JSON summary (``--json``)."""
    doc = json.loads(path.read_text())
    known = {f.name for f in Entry.__dataclass_fields__.values()}
    entries = [Entry(**{k: tuple(v) if k == "requires" else v for k, v in e.items() if k in known}) for e in doc["entries"]]
    fields = {f.name for f in Outcome.__dataclass_fields__.values()}
    outcomes = [Outcome(entry=e["name"], **{k: v for k, v in e.items() if k in fields and k != "entry"})
                for e in doc["entries"]]
    for e, o in zip(entries, outcomes):
        if not o.notices and o.message:  # a summary written before notices were kept
            o.notices = judge(e, {"verdict": o.verdict, "message": o.message}, "").notices
    text, ok = report(entries, outcomes)
    print(text)
    if table:
        table.write_text(markdown(entries, outcomes))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="entries (hf_text.gpt2, gpt2) or modules (hf_audio)")
    ap.add_argument("--sample", action="store_true", help=f"the fixed subset of the test suite ({len(SAMPLE)} entries)")
    ap.add_argument("--jobs", "-j", type=int, default=None, help="reproci's --jobs (default: reproci's own)")
    ap.add_argument("--steps", type=int, default=6, help="N (default 6: three epochs of 2 batches)")
    ap.add_argument("--resume-at", type=int, default=3, help="k (default 3: in the middle of the second epoch)")
    ap.add_argument("--chunk", type=int, default=40, help="models per reproci run (0: all in one)")
    ap.add_argument("--timeout", type=int, default=300, help="reproci's --timeout, seconds per worker run")
    ap.add_argument("--work", type=Path, default=None, help="where reproci writes its results (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="write the JSON summary here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table of docs/zoo.md here")
    ap.add_argument("--list", action="store_true", help="list the entries and what each must give")
    ap.add_argument("--from", dest="summary", type=Path, default=None,
                    help="run nothing: report (and --markdown) from a JSON summary this script wrote")
    a = ap.parse_args(argv)
    if a.summary:
        return from_summary(a.summary, a.markdown)
    entries = select(catalog(), a.only, a.sample)
    if a.list:
        for e in entries:
            print(f"{e.name:42s} {e.family:10s} {e.architecture:44s} {e.expect if e.planted else 'A = B = C'}")
        print(f"{sum(not e.planted for e in entries)} architectures, {sum(e.planted for e in entries)} planted bugs")
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        work = (a.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        outcomes, invocations = run(entries, a.steps, a.resume_at, a.jobs, a.chunk, a.timeout, work)
    text, ok = report(entries, outcomes)
    print(text)
    clean = [o for e, o in zip(entries, outcomes) if not e.planted and not o.skipped]
    summary = {"steps": a.steps, "resume_at": a.resume_at, "jobs": a.jobs, "seconds": round(time.monotonic() - t0, 1),
               "architectures": {"pass": sum(o.ok for o in clean), "total": len(clean)},
               "planted": {"as_expected": sum(o.ok for e, o in zip(entries, outcomes) if e.planted and not o.skipped),
                           "total": sum(e.planted and not o.skipped for e, o in zip(entries, outcomes))},
               "ok": ok, "invocations": invocations,
               "entries": [{**{k: v for k, v in asdict(e).items() if k != "import_check"}, "requires": list(e.requires),
                            **{k: v for k, v in asdict(o).items() if k != "entry"}}
                           for e, o in zip(entries, outcomes)]}
    if a.json:
        a.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"summary: {a.json}")
    if a.markdown:
        a.markdown.write_text(markdown(entries, outcomes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
