import torch

from reproci.worker.determinism import attest, deterministic_mode, launch_environment


def test_deterministic_mode_sets_and_restores():
    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_mode(seed=3, threads=1):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.utils.deterministic.fill_uninitialized_memory
        a = torch.rand(3)
    with deterministic_mode(seed=3, threads=1):
        assert torch.equal(a, torch.rand(3))  # seeded
    assert torch.are_deterministic_algorithms_enabled() == before


def test_attestation_reports_what_did_not_take_effect(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with deterministic_mode(seed=0, threads=1):
        report = attest(seed=0, threads=1, strict=True)
    assert not report["ok"]
    assert not report["checks"]["CUBLAS_WORKSPACE_CONFIG"]["ok"]
    assert report["checks"]["deterministic_algorithms"]["ok"]


def test_attestation_passes_with_the_launch_environment(monkeypatch):
    for k, v in launch_environment(seed=5, threads=1, strict=True).items():
        monkeypatch.setenv(k, v)
    with deterministic_mode(seed=5, threads=1):
        assert attest(seed=5, threads=1, strict=True)["ok"]


def test_launch_environment_pins_threads_and_hash_seed():
    env = launch_environment(seed=7, threads=2, strict=True)
    assert env["PYTHONHASHSEED"] == "7" and env["OMP_NUM_THREADS"] == "2" and env["CUBLAS_WORKSPACE_CONFIG"]
    assert "CUBLAS_WORKSPACE_CONFIG" not in launch_environment(seed=7, threads=2, strict=False)


def test_both_documented_cublas_workspace_values_are_strict(monkeypatch):
    """HF's enable_full_determinism sets ':16:8', which cuBLAS documents as deterministic too;
    a value that is not deterministic says what was expected and that both are fine."""
    for k, v in launch_environment(seed=5, threads=1, strict=True).items():
        monkeypatch.setenv(k, v)
    with deterministic_mode(seed=5, threads=1):
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        assert attest(seed=5, threads=1, strict=True)["ok"]
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
        check = attest(seed=5, threads=1, strict=True)["checks"]["CUBLAS_WORKSPACE_CONFIG"]
    assert not check["ok"] and check["actual"] == ":0:0"
    assert check["expected"] == ":4096:8 or :16:8 (both are deterministic)"


def test_strict_mode_leaves_the_legacy_tf32_getters_and_cudnn_flags_working():
    """Library code reads the legacy getter through ``cudnn.flags`` (transformers' CTC loss):
    under strict mode it must read "TF32 off", and the block must restore every precision."""
    with deterministic_mode(seed=0, threads=1):
        assert torch._C._get_cudnn_allow_tf32() is False
        assert torch.backends.cuda.matmul.allow_tf32 is False
        with torch.backends.cudnn.flags(enabled=False):
            assert not torch.backends.cudnn.enabled
        assert torch.backends.cudnn.enabled
        assert torch.backends.cudnn.conv.fp32_precision == "ieee" == torch.backends.cudnn.rnn.fp32_precision
        assert torch.backends.fp32_precision == "ieee"
        report = attest(seed=0, threads=1, strict=True)
    assert report["checks"]["cudnn_legacy_allow_tf32"] == {"expected": False, "actual": False, "ok": True}


def _tf32_reads() -> dict:
    """What each API says about TF32 (a legacy getter that torch refuses to read: "refused")."""
    from reproci.worker.determinism import _PRECISION_NODES, _precision_node

    reads: dict = {p or "fp32_precision": _precision_node(p).fp32_precision for p in _PRECISION_NODES}
    for name, read in (("float32_matmul_precision", torch.get_float32_matmul_precision),
                       ("matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                       ("cudnn.allow_tf32", lambda: torch._C._get_cudnn_allow_tf32())):
        try:
            reads[name] = read()
        except RuntimeError:
            reads[name] = "refused"
    return reads


def test_strict_mode_turns_tf32_off_through_both_apis_and_the_block_puts_every_flag_back():
    """A process that asked for "high" matmul precision (Lightning's advice), or set TF32 through
    the legacy API and then the new one: strict mode reads "off" through every getter, the ones
    libraries call included (Lightning reads ``get_float32_matmul_precision``, transformers' CTC
    loss ``cudnn.flags``), oneDNN's matmul as well; leaving the block, each API reads what it did."""
    from reproci.worker.determinism import _PRECISION_NODES, _precision_flags, _restore_precision

    original = _precision_flags()
    starts = (lambda: torch.set_float32_matmul_precision("high"),
              lambda: (setattr(torch.backends.cuda.matmul, "allow_tf32", True),
                       setattr(torch.backends.cuda.matmul, "fp32_precision", "ieee")))
    try:
        for start in starts:
            start()
            before = _tf32_reads()
            with deterministic_mode(seed=0, threads=1):
                inside = _tf32_reads()
                with torch.backends.cudnn.flags(enabled=False):
                    pass
            assert _tf32_reads() == before
            assert inside["float32_matmul_precision"] == "highest"
            assert inside["matmul.allow_tf32"] is False and inside["cudnn.allow_tf32"] is False
            assert {inside[p or "fp32_precision"] for p in _PRECISION_NODES} == {"ieee"}
    finally:
        _restore_precision(original)
