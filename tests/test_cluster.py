"""The Ray backend's parts that need no cluster: a cell's options given back from the
user's, as JSON, the one-line refusals, version checks, a cell's directory, and a lost cell's
exit code. The backend on a real cluster is tests/test_ray.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reproci import errors, plugins, verdicts
from reproci.cluster import cell, placement, ray_driver, ray_join
from reproci.commands.run import run_cmd
from reproci.settings import declared
from tests.helpers import unavailable


def parsed(*argv: str) -> dict:
    return run_cmd.make_context("run", list(argv), obj=plugins.stages()).params


@pytest.mark.parametrize("argv", [
    ("--image", "cpu-torch2.13", "--steps", "8", "--resume-at", "4", "-s", "determinism", "-s", "throughput",
     "--memory", "4g", "--pids-limit", "300"),
    ("--no-fork-server", "--compile", "--compile-mode", "max-autotune", "--threads", "2", "--seed", "7"),
    ("--fork-server", "--amp", "bf16", "--bisect", "--cpu-isa", "avx2", "--timeout", "90.5", "--jobs", "2"),
    ("--config", "ci/reproci.yaml", "--slowdown-fails", "--repetitions", "3", "--world-size", "2", "--device", "cuda"),
])
def test_a_cells_options_give_back_every_option_the_user_gave(argv):
    given = parsed(*argv, "-m", "conv", "--results-dir", "out", "--update-golden", "--backend", "ray")
    catalog = plugins.catalog()
    sent = catalog.for_cell(given)
    back = catalog.from_cell(json.loads(json.dumps(sent)))  # as a Ray task or a Slurm spool carries it
    driver_only = {o.key for o in catalog.options() if not o.cell or o.group == declared.CLUSTER}
    assert back == {k: v for k, v in given.items() if k not in driver_only and v not in (None, ())}
    assert not {"models", "results_dir", "update_golden", "backend"} & set(sent)  # the cell sets its own


def test_a_cell_runs_one_model_with_the_drivers_goldens_path_and_records_only_when_asked():
    spec = cell.CellSpec(name="conv@local", model="conv", options={"steps": 8}, goldens_dir="goldens")
    assert cell.command()[3:] == ["run", "--cell-options", cell.OPTIONS_FILE]
    assert cell.options(spec, "results") == {"steps": 8, "models": ["conv"], "results_dir": "results",
                                             "goldens_dir": "goldens"}
    assert cell.options(spec.__class__(**{**spec.__dict__, "update_golden": True}), "results")["update_golden"] is True


def test_a_cells_directory_links_the_project_and_holds_only_the_shipped_golden(tmp_path):
    project, where = tmp_path / "project", tmp_path / "cell"
    (project / "goldens").mkdir(parents=True)
    (project / "goldens" / "local.yaml").write_text("the project's, not shipped")
    (project / "results").mkdir()
    (project / "reproci.yaml").write_text("steps: 8\n")
    (project / "mymodel.py").write_text("")
    where.mkdir()
    spec = cell.CellSpec(name="m@local", model="mymodel.py:build", options={}, goldens_dir="goldens",
                         golden_files={"local.yaml": b"shipped"})
    cell.prepare(spec, project, where)
    assert sorted(p.name for p in where.iterdir()) == ["goldens", "mymodel.py", "reproci.yaml"]
    assert (where / "reproci.yaml").is_symlink() and (where / "reproci.yaml").read_text() == "steps: 8\n"
    assert not (where / "goldens").is_symlink() and (where / "goldens" / "local.yaml").read_bytes() == b"shipped"


def test_a_cells_run_directory_travels_as_a_tar_and_unpacks_in_place(tmp_path):
    run = tmp_path / "results" / "20260101T000000Z-local-1"
    (run / "conv").mkdir(parents=True)
    (run / "results.json").write_text("{}")
    (run / "conv" / "A.json").write_text("[1]")
    data = cell._pack(tmp_path / "results")
    cell.unpack(data, tmp_path / "out")
    assert (tmp_path / "out" / "conv" / "A.json").read_text() == "[1]"
    assert cell._pack(tmp_path / "nothing") is None


@pytest.mark.parametrize("labels,fragment", [(["gpu"], "is not KEY=VALUE"), (["=x"], "is not KEY=VALUE")])
def test_a_node_label_that_is_not_key_equals_value_is_refused(labels, fragment):
    with pytest.raises(errors.UsageError, match=fragment):
        ray_driver.cluster_options(None, labels, env={})


def test_the_address_comes_from_the_flag_then_ray_address_then_a_local_cluster():
    assert ray_driver.cluster_options("h:1", (), env={"RAY_ADDRESS": "e:2"}).address == "h:1"
    assert ray_driver.cluster_options(None, (), env={"RAY_ADDRESS": "e:2"}).address == "e:2"
    assert ray_driver.cluster_options(None, ("a=b",), env={}) == ray_driver.ClusterOptions(None, (("a", "b"),))


def test_a_node_with_other_versions_is_refused_in_one_line_that_names_it():
    node = placement.Node(id="abcdef0123456789", ip="10.0.0.7", labels={}, resources={})
    own = {"python": "3.11.7", "ray": "2.60.0", "reproci": "0.1.0"}
    placement.check_versions({node: dict(own)}, own)
    with pytest.raises(errors.InfrastructureError) as e:
        placement.check_versions({node: {**own, "ray": "2.59.0"}}, own)
    assert str(e.value).startswith("node 10.0.0.7 (abcdef01) runs ray 2.59.0 (this machine 2.60.0)")
    assert "\n" not in str(e.value)


def test_without_ray_installed_the_backend_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(errors.UsageError, match=r"pip install 'reproci\[ray\]'"):
        ray_driver._ray()


def test_a_lost_cell_makes_the_results_an_infrastructure_failure_however_the_others_went():
    doc = {"options": {}, "models": [{"model": "conv", "verdict": verdicts.PASS}]}
    assert verdicts.document_exit_code(doc, plugins.stages()) == errors.EXIT_PASS
    doc["lost_cells"] = ["cell embedding@local on node 10.0.0.7 (abcdef01) was lost: the node died"]
    assert verdicts.document_exit_code(doc, plugins.stages()) == errors.EXIT_INFRA


@pytest.mark.parametrize("argv,fragment", [
    (("--address", "h:1"), "--address places cells on a Ray cluster: add --backend ray"),
    (("--node-label", "a=b"), "--node-label places cells on a Ray cluster: add --backend ray"),
    (("--backend", "docker"), "--backend docker runs in a container: name it with --image"),
    (("--backend", "local", "--image", "cpu-torch2.13"), "--backend local runs without a container"),
    (("--backend", "ray", "--node-label", "nolabel"), "--node-label 'nolabel' is not KEY=VALUE"),
])
def test_backend_options_that_do_not_fit_are_one_line_usage_errors(cli, tmp_path: Path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", *argv)
    assert code == errors.EXIT_USAGE and fragment in err and err.count("error:") == 1, err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("address,fragment", [
    ("not a host", "--address 'not a host': it is not an address; write HOST:PORT with a port from 1 to 65535"),
    ("10.0.0.5:99999", "--address '10.0.0.5:99999': port 99999 is out of range; write HOST:PORT"),
    ("head:0", "port 0 is out of range"),
    ("http://head:6379", "it is not an address"),
    ("head", "it is not an address"),
])
def test_an_address_ray_could_not_take_is_refused_in_one_line_before_ray_starts(cli, tmp_path, monkeypatch,
                                                                                address, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--backend", "ray", "--address", address, "-m", "embedding")
    assert code == errors.EXIT_USAGE and err.startswith(f"error: --address {address!r}: ") and fragment in err, err
    assert err.count("error:") == 1 and "Traceback" not in err and not (tmp_path / "results").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:6379", "head-0.cluster.local:6379", "[::1]:6379", "auto", "local",
                                     "ray://head:10001", "ray://head"])
def test_the_address_forms_ray_takes_are_kept_as_given(address):
    assert ray_driver.cluster_options(address, (), env={}).address == address


def test_a_ray_address_of_the_environment_is_checked_and_named_as_such():
    with pytest.raises(errors.UsageError, match="^RAY_ADDRESS 'h:70000': port 70000 is out of range"):
        ray_driver.cluster_options(None, (), env={"RAY_ADDRESS": "h:70000"})


@pytest.mark.parametrize("threads,world,jobs,given,node_cpus,want", [
    (1, 1, 3, False, 8, (3, 3)),                  # A, B and another run beside: three cores
    (1, 1, 3, False, 2, (2, 2)),                  # the node's two cores, and the runs they hold
    (4, 1, 3, False, 8, (8, 2)),
    (1, 2, 1, True, 16, (2, None)),               # --jobs given: kept, and its cores asked for
    (8, 1, 1, False, 4, (4, 1)),                  # more threads than the node: all of it, one run
])
def test_a_cell_asks_its_node_for_the_cores_its_runs_use(threads, world, jobs, given, node_cpus, want):
    from reproci.settings.models import resolve_all
    from reproci.settings.options import RunOptions

    options = RunOptions(models=resolve_all(("conv",)), threads=threads, world_size=world, jobs=jobs)
    node = placement.Node(id="n" * 16, ip="10.0.0.1", labels={}, resources={"CPU": float(node_cpus)})
    assert placement.cell_cpus(options, node, given) == want


def test_an_address_where_no_cluster_answers_is_one_infrastructure_error_at_once(cli, tmp_path, monkeypatch):
    import importlib.util
    import socket

    if importlib.util.find_spec("ray") is None:
        unavailable("RAY", "Ray is not installed: `pip install -e '.[test]'` installs it")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--backend", "ray", "--address", f"127.0.0.1:{port}", "-m", "embedding")
    assert code == errors.EXIT_INFRA and err.startswith(f"error: cannot reach the Ray cluster at 127.0.0.1:{port}"), err
    assert err.count("error:") == 1 and not (tmp_path / "results").exists()


def _listener(reply: bytes | None):
    """A local port that takes connections and says ``reply`` to each (None: nothing at all),
    as a port that is not a Ray head's may; stopped when the test ends."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test ended
                return
            held.append(conn)
            if reply is not None:
                conn.recv(4096)
                conn.sendall(reply)
    threading.Thread(target=serve, daemon=True).start()
    return server, held


def test_a_port_that_answers_as_no_ray_head_does_is_one_line_at_once(cli, tmp_path, monkeypatch):
    """An open port that says nothing (a firewall's, a service that waits), or that answers what
    no gRPC server would: Ray itself tried for minutes, a log line a second. One line, exit 5,
    before Ray starts (``ray_join.reachable``'s probe of the GCS's first frame)."""
    import importlib.util
    from types import SimpleNamespace

    if importlib.util.find_spec("ray") is None:
        unavailable("RAY", "Ray is not installed: `pip install -e '.[test]'` installs it")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_join, "GCS_ANSWER_S", 1.0)
    monkeypatch.setattr(ray_driver, "_ray", lambda: SimpleNamespace(init=lambda **_: pytest.fail("Ray was started")))
    for reply in (None, b"HTTP/1.1 400 Bad Request\r\n\r\n"):
        server, held = _listener(reply)
        port = server.getsockname()[1]
        try:
            code, out, err = cli("run", "--backend", "ray", "--address", f"127.0.0.1:{port}", "-m", "embedding")
        finally:
            server.close()
            for conn in held:
                conn.close()
        assert code == errors.EXIT_INFRA and err == (
            f"error: no Ray cluster answers at 127.0.0.1:{port}: its port is open, but it did not answer in 1 s as a "
            "Ray head's GCS (a gRPC server) does; pass the port of the head's `ray start --head --port` as --address "
            "HOST:PORT"), err
        assert not (tmp_path / "results").exists()


def test_a_ray_client_address_without_the_client_extra_says_what_to_install(cli, tmp_path, monkeypatch):
    """``ray://`` needs grpcio (``ray[client]``): it said 'make the project smaller'. One line,
    exit 2, before any run."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        unavailable("RAY", "Ray is not installed: `pip install -e '.[test]'` installs it")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--backend", "ray", "--address", "ray://127.0.0.1:10001", "-m", "embedding")
    assert code == errors.EXIT_USAGE and err == (
        "error: ray://127.0.0.1:10001 is a Ray client address, and the Ray client needs Ray's client extra on this "
        "machine: pip install 'ray[client]' (the cluster's Ray version), or give the head's HOST:PORT"), err
    assert "smaller" not in err and not (tmp_path / "results").exists()


def test_ray_s_lines_while_it_fails_to_join_are_held_to_the_one_line_error(capfd):
    """Ray's core writes a warning to stderr each time it tries a GCS that does not answer (20
    times by default): held back, its tries bounded, and the last said in the error's line; a
    join that succeeds gives them back."""
    import os

    for joined in (False, True):
        held: list[str] = []
        try:
            with ray_join.lines_held("10.0.0.1:6379", held):
                assert os.environ["RAY_gcs_server_port_wait_time_s"] == str(ray_join.GCS_TRIES)
                os.write(2, b"[2026-12-07 07:32:45,558 W 23293 23293] gcs_client.cc:210: Failed to get cluster ID\n")
                if not joined:
                    raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
        except ConnectionError:
            pass
        assert held == ["Failed to get cluster ID"]
        assert "RAY_gcs_server_port_wait_time_s" not in os.environ
        assert ("gcs_client.cc:210" in capfd.readouterr().err) == joined
