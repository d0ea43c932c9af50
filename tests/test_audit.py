"""The op audit (``reproci/worker/audit/audit.py``, ``reproci/stages/audit/``): the table
against the installed torch, the matching rules, and real audits of a model with an op
that strict mode refuses on CUDA beside its fixed twin, and of the reference models."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
import torch

from reproci.worker.audit import audit
from tests.helpers import PLUGINS, model_entry


def test_every_entry_exists_in_the_installed_torch_and_its_documentation() -> None:
    """A torch upgrade that renames an op or rewrites the strict-mode list fails here, so
    the table is revisited rather than silently wrong."""
    docs = audit.documented()
    assert sum(v == "raises" for v in docs.values()) >= 10 and sum(v == "deterministic" for v in docs.values()) >= 10
    for entry in audit.TABLE:
        for op in entry.ops:
            assert hasattr(torch.ops.aten, op), op


def test_every_item_of_the_torch_docs_has_an_entry_or_a_reasoned_exclusion() -> None:
    """Docs → table (both lists: "throw RuntimeError" and "use a deterministic implementation")
    and table → docs, for the pinned torch: nothing missing, nothing stale."""
    assert audit.completeness() == {"missing": [], "stale": []}
    assert all(len(reason) > 40 for reason in audit.EXCLUDED.values())


def test_a_docs_item_the_table_lacks_is_reported_as_missing() -> None:
    docs = {**audit.documented(), "torch.nn.NewPool2d when attempting to differentiate a CUDA tensor": "raises"}
    assert audit.completeness(docs)["missing"] == ["torch.nn.NewPool2d when attempting to differentiate a CUDA tensor"]
    fewer = {k: v for k, v in audit.documented().items() if not k.startswith("torch.histc")}
    assert audit.completeness(fewer)["stale"] == ["torch.histc when called on a CUDA tensor"]


def _row(op: str, **kw) -> dict:
    return {"op": op, "overload": f"aten.{op}.default", "phase": "backward", "module": "pool", "where": "m.py:3 (f)",
            "dtype": "torch.float32", "variant": None, **kw}


def test_findings_follow_the_arguments_that_decide_the_cuda_kernel() -> None:
    rows = [_row("index_put", variant="accumulate=False"), _row("index_put", variant="accumulate=True"),
            _row("cumsum", dtype="torch.int64"), _row("cumsum"), _row("median"), _row("add"),
            _row("_adaptive_avg_pool2d_backward")]
    found = {f["op"]: f for f in audit.findings(rows, [])}
    assert set(found) == {"aten::index_put (accumulate=True)", "aten::index_put (accumulate=False)", "aten::cumsum",
                          "aten::_adaptive_avg_pool2d_backward"}
    assert found["aten::cumsum"]["count"] == 1  # the integer cumsum is deterministic on CUDA
    assert list(found)[0] != "aten::index_put (accumulate=True)"  # raises come before slower
    assert found["aten::_adaptive_avg_pool2d_backward"]["where"] == ["pool at m.py:3 (f)"]


def test_a_newer_torch_that_gained_a_deterministic_kernel_turns_raises_into_slower() -> None:
    entry = next(e for e in audit.TABLE if e.ops == ("histc",))
    assert audit._doc_status(entry, {"torch.histc when called on a CUDA tensor": "raises"})[0] == "raises"
    category, checked = audit._doc_status(entry, {"torch.histc when called on a CUDA tensor": "deterministic"})
    assert category == "slower" and "deterministic now" in checked


def test_torch_warnings_under_warn_only_become_findings() -> None:
    warned = ["histc_cuda does not have a deterministic implementation, but you set ..."]
    assert audit.findings([], warned)[0]["op"] == "histc_cuda"


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "section":
            self.ids.append(dict(attrs).get("id", ""))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_audit_names_the_op_strict_mode_refuses_and_spares_the_twin(reproci) -> None:
    plugin = PLUGINS / "portability.py"
    r = reproci("run", "--stage", "audit", "-m", f"{plugin}:pooled", "-m", f"{plugin}:pooled_clean",
                "-m", "conv", "-m", "embedding", "-j", "2")
    assert r.returncode == 0, r.stderr
    assert "Op audit" in r.stdout and "results:" in r.stdout
    doc = reproci.latest()
    pooled = model_entry(doc, "portability.pooled")["audit"]
    first = pooled["findings"][0]
    assert first["op"] == "aten::_adaptive_avg_pool2d_backward" and first["cuda"] == "raises"
    assert first["where"][0].startswith("module 1 at portability.py:") and "mean" in first["advice"]
    assert first["checked"].startswith("torch ")
    clean = model_entry(doc, "portability.pooled_clean")["audit"]
    assert not [f for f in clean["findings"] if f["cuda"] in ("raises", "slower")]
    assert clean["ops_executed"] > 0 and clean["inventory"]
    ops = lambda name: {f["op"]: f["cuda"] for f in model_entry(doc, name)["audit"]["findings"]}  # noqa: E731
    assert ops("conv")["aten::convolution_backward"] == "slower"  # predicted from CPU: the H200's 1.47×
    assert ops("embedding")["aten::index_put (accumulate=True)"] == "slower"  # the H200's 1.13×
    assert model_entry(doc, "conv")["verdict"] == "NOT_CHECKED"
    md = reproci("report", "--format", "md")
    assert "### Op audit" in md.stdout and "`aten::_adaptive_avg_pool2d_backward`" in md.stdout
    html = reproci("report", "--format", "html", "--output", "r.html")  # matplotlib: the test extra has it
    assert html.returncode == 0, html.stderr
    parser = _Sections()
    parser.feed((reproci.cwd / "r.html").read_text())
    assert "audit" in parser.ids and "aten::_adaptive_avg_pool2d_backward" in "".join(parser.text)


def test_a_model_running_every_op_of_the_docs_lists_is_fully_reported(reproci) -> None:
    """Every item of both lists that a CPU can run, run in one step (``plugins/strict_ops.py``),
    is a finding of an entry that stands for it, with the condition it met."""
    r = reproci("run", "--stage", "audit", "-m", f"{PLUGINS / 'strict_ops.py'}:build")
    assert r.returncode == 0, r.stderr
    found = model_entry(reproci.latest(), "strict_ops")["audit"]["findings"]
    reported = {d for f in found for d in f.get("docs", [])}
    missing = [item for item in audit.documented() if not any(item.startswith(d) for d in reported)
               and item not in audit.EXCLUDED]
    assert missing == []
    by_op = {f["op"]: f for f in found}
    assert by_op["aten::index_put (accumulate=False)"]["why"].startswith("aten::index_put (accumulate=False) accumulate=False")
    assert "repeated indices in this step" in by_op["aten::index_add"]["why"]  # index [0, 1, 1, 3]
    assert by_op["aten::nll_loss2d_forward (reduction=1)"]["cuda"] == "raises"
    assert not any("max_unpooling" in f["op"] for f in found)  # torch's warning is the max_unpool entry's, not a new op


def test_transformers_are_predicted_to_take_the_memory_efficient_attention_backward(reproci) -> None:
    """HF GPT-2 and BERT (tiny, random) and the reference transformer, audited on the CPU where
    attention runs a CPU kernel: the prediction is what CUDA would run."""
    libs = PLUGINS / "real_libs.py"
    r = reproci("run", "--stage", "audit", "-m", f"{libs}:gpt2_clm", "-m", f"{libs}:bert_mlm", "-m", "transformer", "-j", "2")
    assert r.returncode == 0, r.stderr
    for name in ("real_libs.gpt2_clm", "real_libs.bert_mlm", "transformer"):
        result = model_entry(reproci.latest(), name)["audit"]
        attention = [f for f in result["findings"] if f["op"].startswith("scaled_dot_product_attention")]
        assert [f["op"] for f in attention] == ["scaled_dot_product_attention → memory-efficient on CUDA"], name
        assert attention[0]["cuda"] == "slower" and "float32 (flash takes fp16/bf16 only)" in attention[0]["why"]
        assert "--amp bf16" in attention[0]["advice"]
        assert result["attention"] and all(c["ran"] in ("math", "CPU flash") for c in result["attention"])


def test_the_embedding_reference_is_told_the_segment_sum_fix_and_its_measured_cost(reproci) -> None:
    r = reproci("run", "--stage", "audit", "-m", "embedding")
    assert r.returncode == 0, r.stderr
    found = {f["op"]: f for f in model_entry(reproci.latest(), "embedding")["audit"]["findings"]}
    advice = found["aten::index_add_"]["advice"]
    assert "reproci.worker.audit.fixes.segment_sum" in advice and "measured 7–10× the op on the CPU" in advice
    assert "slower on CPU" in r.stdout  # the CPU kernel strict mode serialises, said as the CPU's


@pytest.mark.parametrize(("facts", "backend"), [
    ({"dtype": "torch.bfloat16", "mask": None, "head_dim": 64}, "flash"),
    ({"dtype": "torch.float16", "mask": "bool", "head_dim": 64}, "memory-efficient"),
    ({"dtype": "torch.float32", "mask": None, "head_dim": 64}, "memory-efficient"),
    ({"dtype": "torch.bfloat16", "mask": None, "head_dim": 300}, "math"),
    ({"dtype": "torch.float64", "mask": None, "head_dim": 64}, "math"),
])
def test_the_cuda_attention_backend_is_predicted_from_the_inputs(facts, backend) -> None:
    from reproci.worker.audit import attention

    assert attention.predict(facts)[0] == backend


def test_the_check_table_command_says_the_table_covers_the_pinned_torch(cli, monkeypatch) -> None:
    code, out, _ = cli("audit", "--check-table")
    assert code == 0 and f"torch {torch.__version__}: 48 items" in out and "covers every item" in out
    extra = {**audit.documented(), "torch.nn.NewPool2d when attempting to differentiate a CUDA tensor": "raises"}
    monkeypatch.setattr(audit, "documented", lambda: extra)
    code, out, _ = cli("audit", "--check-table")
    assert code == 1 and "missing: torch.nn.NewPool2d when attempting to differentiate a CUDA tensor (torch: raises)" in out
