"""The op audit (``pipeline/worker/audit.py``, ``pipeline/stages/audit.py``): the table
against the installed torch, the matching rules, and real audits of a model with an op
that strict mode refuses on CUDA beside its fixed twin, and of the reference models."""

from __future__ import annotations

from html.parser import HTMLParser

import torch

from pipeline.worker import audit
from tests.helpers import PLUGINS, model_entry


def test_every_entry_exists_in_the_installed_torch_and_its_documentation() -> None:
    """A torch upgrade that renames an op or rewrites the strict-mode list fails here, so
    the table is revisited rather than silently wrong."""
    docs = audit.documented()
    assert sum(v == "raises" for v in docs.values()) >= 10 and sum(v == "deterministic" for v in docs.values()) >= 10
    for entry in audit.TABLE:
        for op in entry.ops:
            assert hasattr(torch.ops.aten, op), op
        if entry.doc is not None:
            assert any(item.startswith(entry.doc) for item in docs), entry.doc


def _row(op: str, **kw) -> dict:
    return {"op": op, "overload": f"aten.{op}.default", "phase": "backward", "module": "pool", "where": "m.py:3 (f)",
            "dtype": "torch.float32", "variant": None, **kw}


def test_findings_follow_the_arguments_that_decide_the_cuda_kernel() -> None:
    rows = [_row("index_put", variant="accumulate=False"), _row("index_put", variant="accumulate=True"),
            _row("cumsum", dtype="torch.int64"), _row("cumsum"), _row("median"), _row("add"),
            _row("_adaptive_avg_pool2d_backward")]
    found = {f["op"]: f for f in audit.findings(rows, [])}
    assert set(found) == {"aten::index_put (accumulate=True)", "aten::cumsum", "aten::_adaptive_avg_pool2d_backward"}
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
    assert first["where"][0].startswith("1 at portability.py:") and "mean" in first["advice"]
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
    html = reproci("report", "--format", "html", "--output", "r.html")
    if html.returncode == 0:  # needs matplotlib (the [report] extra)
        parser = _Sections()
        parser.feed((reproci.cwd / "r.html").read_text())
        assert "audit" in parser.ids and "aten::_adaptive_avg_pool2d_backward" in "".join(parser.text)
