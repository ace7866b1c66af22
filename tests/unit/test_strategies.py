"""The recipe page's strategies: the entrypoint composes multi_node_tp from its environment (the file
the images run), `build.py run --strategy` writes that environment, and every bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gemma4_images.check import running
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_serve as serve
from tests.cli import build_py

M = matrix.load()
NODE = {"GEMMA4_STRATEGY": "multi_node_tp", "GEMMA4_NODES": "2", "GEMMA4_MASTER_ADDR": "10.0.0.5"}


def test_single_node_is_the_recipes_launch_unchanged():
    for name in M.targets:
        assert serve.compose(M.recipe(name), {"GEMMA4_STRATEGY": "single_node_tp"}, []) == M.recipe_launch(name)


@pytest.mark.parametrize("name", ["h100", "mi300x", "xeon6"])
def test_multi_node_adds_vllms_multi_node_flags_before_the_users(name):
    leader = serve.compose(M.recipe(name), {**NODE, "GEMMA4_NODE_RANK": "0"}, ["--max-model-len", "4096"])
    flags = ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0"]
    flags += ["--master-addr", "10.0.0.5", "--master-port", "29501"]
    assert leader == M.recipe_launch(name) + flags + ["--max-model-len", "4096"]
    worker = serve.compose(M.recipe(name), {**NODE, "GEMMA4_NODE_RANK": "1", "GEMMA4_MASTER_PORT": "4000"}, [])
    assert worker[-5:] == ["--master-addr", "10.0.0.5", "--master-port", "4000", "--headless"]


def test_a_leaderworkerset_pods_own_variables_are_the_defaults():
    lws = {"GEMMA4_STRATEGY": "multi_node_tp", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "3"}
    cmd = serve.compose(M.recipe("h100"), {**lws, "LWS_LEADER_ADDRESS": "g-0.g.ns"}, [])
    assert cmd[-11:] == [
        *("--tensor-parallel-size", "4", "--nnodes", "4", "--node-rank", "3"),
        *("--master-addr", "g-0.g.ns", "--master-port", "29501", "--headless"),
    ]


@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"GEMMA4_STRATEGY": "pipeline"},
            "GEMMA4_STRATEGY='pipeline' is not a strategy; valid: single_node_tp, multi_node_tp",
        ),
        ({**NODE, "GEMMA4_NODES": "1", "GEMMA4_NODE_RANK": "0"}, "GEMMA4_NODES=1: multi_node_tp spans 2 nodes or more"),
        ({**NODE, "GEMMA4_NODE_RANK": "2"}, "GEMMA4_NODE_RANK=2 is not a node of 2 (0 to 1)"),
        ({**NODE, "GEMMA4_NODE_RANK": "x"}, "GEMMA4_NODE_RANK='x': multi_node_tp needs a whole number"),
        (
            {"GEMMA4_STRATEGY": "multi_node_tp", "GEMMA4_NODES": "2", "GEMMA4_NODE_RANK": "0"},
            "needs GEMMA4_MASTER_ADDR",
        ),
        ({**NODE, "GEMMA4_NODE_RANK": "0", "GEMMA4_MASTER_PORT": "99999"}, "GEMMA4_MASTER_PORT='99999' is not a port"),
        ({**NODE, "GEMMA4_NODE_RANK": "0", "GEMMA4_MASTER_PORT": "0"}, "GEMMA4_MASTER_PORT='0' is not a port"),
        ({**NODE, "GEMMA4_NODE_RANK": "0", "GEMMA4_MASTER_PORT": "-1"}, "GEMMA4_MASTER_PORT='-1' is not a port"),
    ],
)
def test_bad_strategy_input_is_one_usage_error(env, says):
    with pytest.raises(serve.UsageError, match=None) as e:
        serve.compose(M.recipe("xeon6"), env, [])
    assert says in str(e.value)


@pytest.mark.parametrize("name", ["gaudi2", "trillium", "ironwood"])
def test_a_strategy_the_recipe_does_not_allow_is_refused_with_why(name):
    with pytest.raises(serve.UsageError, match=f"GEMMA4_STRATEGY=multi_node_tp is not available on {name}: "):
        serve.compose(M.recipe(name), {**NODE, "GEMMA4_NODE_RANK": "0"}, [])


def test_a_split_the_models_heads_do_not_allow_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_attention_heads": 2}}))
    env = {**NODE, "GEMMA4_NODES": "3", "GEMMA4_NODE_RANK": "0", "GEMMA4_MODEL": str(tmp_path)}
    with pytest.raises(serve.UsageError) as e:
        serve.compose(M.recipe("xeon6"), env, [])
    assert str(e.value) == (
        "tensor parallelism 3 (3 nodes) does not divide the model's 2 attention heads; "
        "use a number of nodes that does (2)"
    )
    assert serve.compose(M.recipe("xeon6"), {**env, "GEMMA4_NODES": "2"}, [])[-10:-8] == ["--tensor-parallel-size", "2"]


def test_a_node_runs_on_the_hosts_network_without_its_ipc_namespace():
    line = running.run_line(M, "xeon6", None, running.strategy_env(M, "xeon6", "multi_node_tp", 2, 1, "10.0.0.5"))
    assert "--network=host" in line and "--ipc=host" not in line and "-p 8000:8000" not in line
    assert "-e GEMMA4_NODE_RANK=1" in line and "--shm-size=16g" in line
    assert "--ipc=host" in running.run_line(M, "xeon6", None, {})  # the recipe's own, one node


NODE_0 = ["--strategy", "multi_node_tp", "--nodes", "2", "--node-rank", "0", "--master-addr", "a"]


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--strategy", "multi_node_tp", "--nodes", "1", "--node-rank", "0", "--master-addr", "a"],
            "--nodes 1: multi_node_tp spans 2 nodes",
        ),
        (
            ["--strategy", "multi_node_tp", "--nodes", "2", "--node-rank", "2", "--master-addr", "a"],
            "--node-rank 2: give this node's rank, 0 to 1",
        ),
        (["--strategy", "multi_node_tp", "--nodes", "2", "--node-rank", "0"], "multi_node_tp needs --master-addr"),
        (["--strategy", "ring"], "--strategy 'ring' is not a strategy"),
        ([*NODE_0, "--master-port", "0"], "--master-port 0: give 1 to 65535 (a TCP port)"),
        ([*NODE_0, "--master-port", "99999"], "--master-port 99999: give 1 to 65535 (a TCP port)"),
        (["--nodes", "2"], "--nodes, --node-rank and --master-addr are for --strategy multi_node_tp"),
    ],
)
def test_run_refuses_bad_strategy_input_in_one_line(args, says):
    r = build_py("run", "cpu", "--print", *args)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert says in r.stderr


def test_run_refuses_a_strategy_the_targets_recipe_does_not_allow():
    r = build_py(
        "run",
        "gaudi2",
        "--print",
        "--strategy",
        "multi_node_tp",
        "--nodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "a",
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --strategy multi_node_tp is not available on gaudi2: the Gaudi 2 recipe (000)")


# -- a node of a group runs vLLM as the entrypoint's child (image/gemma4_serve.py, supervise) -----

# The entrypoint as the image runs it, its state files in a test folder instead of /tmp.
ENTRYPOINT = """
import sys
from gemma4_images.spec.image_code import gemma4_serve as serve
serve.PORT_FILE, serve.SERVED_FILE, serve.GROUP_FILE = sys.argv[1:]
sys.exit(serve.main([]))
"""


def node_entrypoint(tmp_path, vllm: str) -> subprocess.Popen:
    """The entrypoint of a headless node whose recipe's command is the shell script vllm."""
    stub = tmp_path / "vllm"
    stub.write_text(f"#!/bin/sh\n{vllm}\n")
    stub.chmod(0o755)
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({**M.recipe("xeon6"), "command": [str(stub)]}))
    model = tmp_path / "model"  # a local model folder, as the entrypoint checks one before vLLM
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, **NODE, "GEMMA4_NODE_RANK": "1", "GEMMA4_RECIPE": str(recipe), "GEMMA4_MODEL": str(model)}
    files = [str(tmp_path / name) for name in ("port", "served", "group")]
    return subprocess.Popen(
        [sys.executable, "-c", ENTRYPOINT, *files], env=env, stderr=subprocess.PIPE, text=True, cwd=matrix.ROOT
    )


def test_a_node_whose_vllm_ends_unasked_exits_non_zero(tmp_path):
    # vLLM's own exit 0 after its group broke (a leader after a failed request, a headless node whose
    # worker died): a restart policy "on failure" must see a failure.
    node = node_entrypoint(tmp_path, "exit 0")
    assert node.wait(timeout=60) == 1
    assert "gemma4-serve: vLLM exited (0) without being asked to stop" in node.stderr.read()


def test_a_node_asked_to_stop_exits_as_vllm_does(tmp_path):
    node = node_entrypoint(tmp_path, f"trap 'exit 0' TERM; touch {tmp_path}/up; while :; do sleep 0.1; done")
    deadline = time.monotonic() + 60
    while not (tmp_path / "up").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    node.send_signal(signal.SIGTERM)  # `docker stop`: vLLM gets it and ends cleanly
    assert node.wait(timeout=60) == 0, node.stderr.read()


@pytest.mark.parametrize("command", ["run", "k8s"])
@pytest.mark.parametrize("nodes", [3, 5, 6, 7, 16])
def test_a_split_e2bs_heads_do_not_allow_is_refused_before_anything_is_printed(command, nodes):
    """E2B has 8 attention heads (targets.yaml project.attention_heads, with its source): tensor
    parallelism over 2, 4 or 8 nodes splits them, any other count is one line naming the count,
    the heads and where the figure comes from, and nothing on stdout."""
    args = ["--strategy", "multi_node_tp", "--nodes", str(nodes)]
    if command == "run":
        args += ["--node-rank", "0", "--master-addr", "10.0.0.5", "--print"]
    r = build_py(command, "h100", *args)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    (line,) = r.stderr.splitlines()
    assert f"tensor parallelism {nodes} does not divide google/gemma-4-E2B-it's 8 attention heads" in line
    assert "text_config.num_attention_heads" in line and line.endswith("give --nodes 2, 4, 8")


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_the_splits_e2b_allows_render(nodes):
    r = build_py("k8s", "h100", "--strategy", "multi_node_tp", "--nodes", str(nodes))
    assert r.returncode == 0, r.stderr


def test_the_entrypoint_knows_the_heads_of_the_recipes_hub_models():
    """A hub id has no config.json in the container: for the recipe's own model and its variants the
    entrypoint holds the split to the recipe's head count, as the host does; other hub ids are vLLM's."""
    env = {**NODE, "GEMMA4_NODES": "3", "GEMMA4_NODE_RANK": "0"}
    with pytest.raises(serve.UsageError, match="does not divide the model's 8 attention heads"):
        serve.compose(M.recipe("h100"), env, [])
    with pytest.raises(serve.UsageError, match="does not divide the model's 8 attention heads"):
        serve.compose(M.recipe("h100"), {**env, "GEMMA4_VARIANT": "fp8"}, [])
    assert "--tensor-parallel-size" in serve.compose(M.recipe("h100"), {**env, "GEMMA4_MODEL": "other/model"}, [])
