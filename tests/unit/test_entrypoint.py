"""The image's entrypoint: the launch it builds for every target, the run-time choices and the
recipe's "what not to do" guards. These import the very file the images run."""

import json
import shlex

import pytest

from gemma4_images.spec import matrix
from gemma4_images.spec.facts import BUILD_FACTS
from gemma4_images.spec.image_code import gemma4_serve as serve


@pytest.fixture(scope="module")
def m():
    return matrix.load()


@pytest.mark.parametrize("name", sorted(matrix.load().targets))
def test_default_launch_is_the_recipe_flag_for_flag(m, name):
    assert serve.compose(m.recipe(name), {}, []) == m.recipe_launch(name)


def test_user_args_come_last_so_they_win(m):
    cmd = serve.compose(m.recipe("h100"), {}, ["--max-model-len", "8192"])
    assert cmd[-2:] == ["--max-model-len", "8192"]


def test_variant_changes_the_model(m):
    cmd = serve.compose(m.recipe("h100"), {"GEMMA4_VARIANT": "fp8"}, [])
    assert cmd[2] == "RedHatAI/gemma-4-E2B-it-FP8-dynamic"
    cmd = serve.compose(m.recipe("mi300x"), {"GEMMA4_MODEL": "/models/tiny"}, [])
    assert cmd[2:4] == ["--model", "/models/tiny"]


def test_variant_without_checkpoint_or_off_family_is_refused(m):
    with pytest.raises(serve.UsageError, match="GEMMA4_MODEL"):
        serve.compose(m.recipe("h100"), {"GEMMA4_VARIANT": "w4a16"}, [])
    assert serve.compose(m.recipe("h100"), {"GEMMA4_VARIANT": "w4a16", "GEMMA4_MODEL": "x/y"}, [])[2] == "x/y"
    with pytest.raises(serve.UsageError, match="valid: default"):
        serve.compose(m.recipe("gaudi2"), {"GEMMA4_VARIANT": "fp8"}, [])


def test_features_replace_edit_and_none(m):
    r = m.recipe("h100")
    assert "--reasoning-parser" not in serve.compose(r, {"GEMMA4_FEATURES": "-reasoning"}, [])
    only = serve.compose(r, {"GEMMA4_FEATURES": "text_only"}, [])
    assert "--tool-call-parser" not in only and '{"image": 0, "audio": 0}' in only
    spec = serve.compose(r, {"GEMMA4_FEATURES": "+spec_decoding"}, [])
    assert spec.index("--speculative-config") > spec.index("--reasoning-parser")
    fast = serve.compose(m.recipe("xeon6"), {"GEMMA4_FEATURES": "+fast_prefill"}, [])
    assert "--kv-sharing-fast-prefill" in fast and "--kv-sharing-fast-prefill" not in serve.compose(r, {}, [])
    assert serve.compose(r, {"GEMMA4_FEATURES": "none"}, []) == [
        "vllm",
        "serve",
        "google/gemma-4-E2B-it",
        "--tensor-parallel-size",
        "1",
    ]


@pytest.mark.parametrize(
    "spec, match", [("telepathy", "unknown feature 'telepathy'"), ("reasoning,+text_only", "mixes names")]
)
def test_bad_feature_spec(m, spec, match):
    with pytest.raises(serve.UsageError, match=match):
        serve.compose(m.recipe("h100"), {"GEMMA4_FEATURES": spec}, [])


def test_gaudi_refuses_spec_decoding_with_reason(m):
    with pytest.raises(serve.UsageError, match="no HPU path"):
        serve.compose(m.recipe("gaudi2"), {"GEMMA4_FEATURES": "+spec_decoding"}, [])


@pytest.mark.parametrize("value", ["1", "true", "false", "0", ""])
def test_skip_warmup_refused_whatever_its_value(m, value):
    with pytest.raises(serve.UsageError, match="any non-empty value"):
        serve.guard_warnings(m.recipe("gaudi2"), {"VLLM_SKIP_WARMUP": value}, [])


def test_gaudi_warnings(m):
    r = m.recipe("gaudi2")
    assert serve.guard_warnings(r, {"VLLM_PROMPT_BS_BUCKET_MAX": "1"}, []) == []
    (bucket,) = serve.guard_warnings(r, {"VLLM_PROMPT_BS_BUCKET_MAX": "8"}, [])
    assert "batch" in bucket or "together" in bucket
    (prefix,) = serve.guard_warnings(r, {}, ["--enable-prefix-caching"])
    assert "35-layer" in prefix
    # Other targets have no such guards.
    assert serve.guard_warnings(m.recipe("h100"), {"VLLM_SKIP_WARMUP": "1"}, ["--enable-prefix-caching"]) == []


def run_main(tmp_path, monkeypatch, recipe, argv, env=None):
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    monkeypatch.setenv("GEMMA4_RECIPE", str(path))
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return serve.main(argv)


def test_print_command_and_exit_codes(m, tmp_path, monkeypatch, capsys):
    assert run_main(tmp_path, monkeypatch, m.recipe("gaudi2"), ["--print-command", "--max-num-seqs", "8"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("vllm serve google/gemma-4-E2B-it --max-model-len 32768")
    assert out.endswith("--max-num-seqs 8")
    assert run_main(tmp_path, monkeypatch, m.recipe("gaudi2"), ["--print-command"], {"VLLM_SKIP_WARMUP": "false"}) == 2
    assert "VLLM_SKIP_WARMUP" in capsys.readouterr().err


def test_self_check_reports_missing_files_and_vllm(m, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problems = serve.self_check(m.recipe("h100"))
    assert any("examples/tool_chat_template_gemma4.jinja" in p for p in problems)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "tool_chat_template_gemma4.jinja").write_text("{{ messages }}")
    assert not any("jinja" in p for p in serve.self_check(m.recipe("h100")))


def test_self_check_names_the_release_a_base_of_another_vllm_is(m, monkeypatch):
    monkeypatch.setattr(serve, "installed_vllm", lambda: ("vllm", "0.32.0+cu130"))
    (line,) = [p for p in serve.self_check(m.recipe("h100"), probes=False) if "base image has" in p]
    assert line == (
        f"base image has vllm 0.32.0+cu130, the recipe pins vLLM {m.project.vllm_version}: use a base with that "
        "version, or build with --vllm 0.32.0 if releases/ has that release"
    )


def test_flag_value_forms():
    assert serve.flag_value(["--port", "1", "--port=2"], "--port") == "2"
    assert serve.flag_value(["--port", "9"], "--port") == "9"
    assert serve.flag_value(["--portal", "9"], "--port") is None


def test_build_info_uses_the_label_table(tmp_path):
    out = tmp_path / "etc" / "build.json"
    serve.write_build_info(str(out), {"GEMMA4_TARGET": "h100", "GEMMA4_REVISION": "abc"}, {"labels": BUILD_FACTS})
    data = json.loads(out.read_text())
    assert set(data) == set(BUILD_FACTS)
    assert data["io.gemma4-images.target"] == "h100"
    assert data["org.opencontainers.image.revision"] == "abc"


# -- audio switched off, and the build's capability check ------------------------------------------


def without_audio(m, name):
    return {**m.recipe(name), "unsupported_modalities": {"audio": "no audio here"}}


def test_audio_off_limits_audio_to_zero_in_the_value_vllm_uses(m):
    cmd = serve.compose(without_audio(m, "h100"), {}, [])
    assert cmd[-2:] == ["--limit-mm-per-prompt", '{"audio": 0}']
    assert serve.mm_limits(cmd) == {"audio": 0}
    # text_only's value already refuses audio: nothing is added (gaudi2's launch stays the recipe's).
    assert serve.compose(m.recipe("gaudi2"), {"GEMMA4_FEATURES": "-tool_calling"}, [])[-4:-2] == [
        "--limit-mm-per-prompt",
        '{"image":0,"audio":0,"video":0}',
    ]
    # Without text_only the image keeps images and still refuses audio.
    cmd = serve.compose(m.recipe("gaudi2"), {"GEMMA4_FEATURES": "-text_only"}, [])
    assert serve.mm_limits(cmd) == {"audio": 0}


def test_audio_off_edits_the_users_limit_in_place_and_follows_dotted_forms(m):
    r = without_audio(m, "h100")
    cmd = serve.compose(r, {}, ["--limit-mm-per-prompt", '{"image": 4}'])
    assert cmd.count("--limit-mm-per-prompt") == 1 and serve.mm_limits(cmd) == {"image": 4, "audio": 0}
    cmd = serve.compose(r, {}, ['--limit-mm-per-prompt={"image": 2}'])
    assert serve.mm_limits(cmd) == {"image": 2, "audio": 0}
    # vLLM merges dotted forms into one value placed after everything else: answer in kind.
    cmd = serve.compose(r, {}, ["--limit-mm-per-prompt.image", "2"])
    assert cmd[-2:] == ["--limit-mm-per-prompt.audio", "0"] and serve.mm_limits(cmd) == {"image": 2, "audio": 0}


@pytest.mark.parametrize(
    "args", [["--limit-mm-per-prompt", '{"image": 4, "audio": 1}'], ["--limit-mm-per-prompt.audio", "1"]]
)
def test_audio_off_refuses_a_launch_that_asks_for_audio(m, args):
    with pytest.raises(
        serve.UsageError, match="allows audio, which h100 cannot serve .no audio here; .*unsupported_modalities"
    ):
        serve.compose(without_audio(m, "h100"), {}, args)


def test_mm_limits_reads_what_vllm_keeps():
    assert serve.mm_limits(["vllm", "serve"]) == {}
    assert serve.mm_limits(["--limit-mm-per-prompt", '{"a": 1}', "--limit-mm-per-prompt", '{"b": 2}']) == {"b": 2}
    # Dotted values replace the JSON one whatever the order (vLLM appends them last).
    assert serve.mm_limits(["--limit-mm-per-prompt.audio", "0", "--limit-mm-per-prompt", '{"image": 1}']) == {
        "audio": 0
    }


def test_probe_plan_follows_the_launch(m):
    plan = dict(serve.probe_plan(m.recipe("h100")))
    assert plan == {
        "transformers": None,
        "model_info": ["Gemma4ForConditionalGeneration", None],
        "image": None,
        "tool_parser:gemma4": "gemma4",
        "reasoning_parser:gemma4": "gemma4",
        "audio": None,
        "cuda": None,
        "launch": serve.launches(m.recipe("h100")),
    }
    assert list(plan)[-1] == "launch"  # it may switch vLLM's platform for the probes after it
    with_flag = dict(serve.probe_plan(m.recipe("h100"), user_args=["--x"]))["launch"]
    assert with_flag == serve.launches(m.recipe("h100"), ["--x"])
    assert dict(serve.probe_plan(m.recipe("h100"), "/seed"))["model_info"] == [
        "Gemma4ForConditionalGeneration",
        "/seed",
    ]
    assert "audio" not in dict(serve.probe_plan(m.recipe("gaudi2")))  # unsupported_modalities: audio
    assert "audio" not in dict(serve.probe_plan(m.recipe("trillium")))
    assert "cuda" not in dict(serve.probe_plan(m.recipe("mi300x")))


def test_model_info_is_seeded_where_vllm_looks_and_never_over_a_file(tmp_path):
    seed = tmp_path / "seed"
    (seed / "modelinfos").mkdir(parents=True)
    (seed / "modelinfos" / "m-C.json").write_text("built")
    home = tmp_path / "home"
    serve.seed_model_info({"HOME": str(home)}, str(seed))  # vLLM's default: ~/.cache/vllm
    assert (home / ".cache/vllm/modelinfos/m-C.json").read_text() == "built"
    (home / ".cache/vllm/modelinfos/m-C.json").write_text("the server's own")
    serve.seed_model_info({"HOME": str(home)}, str(seed))
    assert (home / ".cache/vllm/modelinfos/m-C.json").read_text() == "the server's own"
    serve.seed_model_info({"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg")}, str(seed))
    assert (tmp_path / "xdg/vllm/modelinfos/m-C.json").exists()
    serve.seed_model_info({"HOME": str(home), "VLLM_CACHE_ROOT": str(tmp_path / "root")}, str(seed))
    assert (tmp_path / "root/modelinfos/m-C.json").exists()
    serve.seed_model_info({"HOME": str(home)}, str(tmp_path / "no-seed"))  # an image without one: nothing


def test_capability_problems_name_the_target_and_the_switch(m):
    results = {
        "transformers": {"ok": True, "value": None},
        "audio": {"ok": False, "error": "ModuleNotFoundError: No module named 'av'"},
        "cuda": {"ok": True, "value": "13.0"},
    }
    problems = serve.capability_problems(m.recipe("h200"), results)
    assert problems == [
        "h200: the base cannot decode and resample audio with vLLM's loader (ModuleNotFoundError: No module "
        "named 'av'); the audio extras must install (audio_extras in the release file), or list audio under "
        "h200's serve.unsupported_modalities to build an image whose launch refuses audio",
        "h200: the base's torch is built for CUDA 13.0, h200 expects CUDA 12.9: build on "
        "vllm/vllm-openai:v0.30.0-cu129 (vllm/vllm-openai:v0.30.0 is the CUDA 13.0 build)",
    ]
    assert serve.capability_problems(m.recipe("b300"), {"cuda": {"ok": True, "value": "13.0"}}) == []


@pytest.mark.slow  # `make test-fast` leaves it out
def test_probes_run_in_a_child_and_report_each_failure(m):
    # On this host vLLM is not installed: the vLLM probes fail one by one, the rest still answer.
    results = serve.run_probes([("transformers", None), ("tool_parser:gemma4", "gemma4"), ("cuda", None)])
    assert results["transformers"] == {"ok": True, "value": None}
    assert results["tool_parser:gemma4"] == {"ok": False, "error": "ModuleNotFoundError: No module named 'vllm'"}
    assert results["cuda"] == {"ok": True, "value": ""}


def test_test_media_decode_as_what_they_claim():
    import io
    import wave

    from PIL import Image

    assert Image.open(io.BytesIO(serve.test_png(32))).size == (32, 32)
    with wave.open(io.BytesIO(serve.test_wav())) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (44100, 1, 22050)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "is not a gemma4-images recipe"),
    ],
)
def test_a_broken_recipe_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys, content, message):
    path = tmp_path / "recipe.json"
    path.write_text(content)
    monkeypatch.setenv("GEMMA4_RECIPE", str(path))
    assert serve.main(["--print-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gemma4-serve: error: the recipe {path} {message}") and err.count("\n") == 1


def test_write_build_info_without_a_path_is_a_usage_error(m, tmp_path, monkeypatch, capsys):
    assert run_main(tmp_path, monkeypatch, m.recipe("h100"), ["--write-build-info"]) == 2
    assert "--write-build-info takes one argument" in capsys.readouterr().err


# -- the hub's offline mode for a local model -------------------------------------------------------


def start(tmp_path, monkeypatch, recipe, env, argv=()):
    """(the entrypoint's exit code, what it hands to vLLM: {"env", "cmd"}, {} when it starts
    nothing); os.execvp stubbed."""
    seen = {}
    left_out = (*serve.OFFLINE_VARS, *serve.USAGE_STATS_VARS)
    monkeypatch.setattr(serve.os, "environ", {k: v for k, v in serve.os.environ.items() if k not in left_out})
    monkeypatch.setattr(serve, "PORT_FILE", str(tmp_path / "port"))
    monkeypatch.setattr(serve, "SERVED_FILE", str(tmp_path / "served"))
    monkeypatch.setattr(serve.os, "execvp", lambda exe, cmd: seen.update(env=dict(serve.os.environ), cmd=cmd))
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    serve.os.environ.update({"GEMMA4_RECIPE": str(path), **env})
    return serve.main(list(argv)), seen


def serve_env(tmp_path, monkeypatch, recipe, env, argv=()):
    """The environment the entrypoint hands to vLLM."""
    return start(tmp_path, monkeypatch, recipe, env, argv)[1]["env"]


@pytest.fixture
def local_model(tmp_path):
    """GEMMA4_MODEL naming a model's folder (config.json beside the weights)."""
    folder = tmp_path / "models" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return {"GEMMA4_MODEL": str(folder)}


@pytest.mark.parametrize(
    "model, says",
    [
        ("/models/gone", "GEMMA4_MODEL=/models/gone: no such folder in the container; mount the model's folder "),
        ("./gone", "GEMMA4_MODEL=./gone: no such folder in the container; "),
        ("../gone", "GEMMA4_MODEL=../gone: no such folder in the container; "),
        ("empty", "GEMMA4_MODEL=empty: the folder holds no config.json"),  # OWNER/NAME's form, but a folder here
        ("weights.safetensors", "GEMMA4_MODEL=weights.safetensors: no such folder in the container"),
    ],
    ids=["absolute", "./", "../", "a folder without config.json", "a file"],
)
def test_a_local_model_that_is_not_there_is_refused_before_vllm_starts(m, tmp_path, monkeypatch, capsys, model, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.safetensors").write_bytes(b"")
    code, started = start(tmp_path, monkeypatch, m.recipe("xeon6"), {"GEMMA4_MODEL": model})
    assert code == 2 and started == {}
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gemma4-serve: error: {says}"), line


def test_a_hub_id_and_a_model_folder_start_vllm(m, tmp_path, monkeypatch, local_model):
    monkeypatch.chdir(tmp_path)  # no folder of the hub id's name here
    for env in ({"GEMMA4_MODEL": "google/gemma-4-E2B-it"}, {"GEMMA4_MODEL": "gemma-4-E2B-it"}, local_model):
        _, started = start(tmp_path, monkeypatch, m.recipe("xeon6"), env)
        assert env["GEMMA4_MODEL"] in started["cmd"]


def test_a_local_model_is_served_with_the_hub_offline(m, tmp_path, monkeypatch, capsys, local_model):
    env = serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), local_model)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE=1: the model is a local path" in capsys.readouterr().err


def test_a_hub_model_is_served_online(m, tmp_path, monkeypatch):
    assert "HF_HUB_OFFLINE" not in serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {})
    # OWNER/NAME is a hub id unless such a folder exists here.
    monkeypatch.chdir(tmp_path)
    assert "HF_HUB_OFFLINE" not in serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {"GEMMA4_MODEL": "org/tiny"})
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    (tmp_path / "org" / "tiny" / "config.json").write_text("{}")
    assert serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {"GEMMA4_MODEL": "org/tiny"})["HF_HUB_OFFLINE"] == "1"


def test_offline_is_not_set_when_the_launch_needs_the_hub_or_the_user_chose(
    m, tmp_path, monkeypatch, capsys, local_model
):
    local = local_model
    # spec_decoding's drafter is a hub id: offline would make the start-up fail.
    env = serve_env(tmp_path, monkeypatch, m.recipe("h100"), {**local, "GEMMA4_FEATURES": "+spec_decoding"})
    assert "HF_HUB_OFFLINE" not in env
    assert "google/gemma-4-E2B-it-assistant on the hub: HF_HUB_OFFLINE is not set" in capsys.readouterr().err
    env = serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), local, ["--tokenizer", "google/gemma-4-E2B-it"])
    assert "HF_HUB_OFFLINE" not in env
    env = serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {**local, "HF_HUB_OFFLINE": "0"})
    assert env["HF_HUB_OFFLINE"] == "0"


def test_vllms_usage_report_is_off_unless_the_user_chose(m, tmp_path, monkeypatch, capsys):
    env = serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {})
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert "VLLM_NO_USAGE_STATS=1: vLLM's usage report to stats.vllm.ai is off" in capsys.readouterr().err
    chose = serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {"VLLM_NO_USAGE_STATS": "0"})
    assert chose["VLLM_NO_USAGE_STATS"] == "0"
    assert "VLLM_NO_USAGE_STATS" not in serve_env(tmp_path, monkeypatch, m.recipe("xeon6"), {"DO_NOT_TRACK": "1"})


def test_print_command_says_the_hub_is_offline(m, tmp_path, monkeypatch, capsys):
    for var in serve.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    recipe = m.recipe("xeon6")
    assert run_main(tmp_path, monkeypatch, recipe, ["--print-command"], {"GEMMA4_MODEL": "/models/tiny"}) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("export HF_HUB_OFFLINE=1  # ")
    assert shlex.split(lines[-1]) == serve.compose(recipe, {"GEMMA4_MODEL": "/models/tiny"}, [])
    # A hub model: the launch alone, one line, as before.
    monkeypatch.delenv("GEMMA4_MODEL")
    assert run_main(tmp_path, monkeypatch, recipe, ["--print-command"]) == 0
    assert shlex.split(capsys.readouterr().out) == m.recipe_launch("xeon6")


@pytest.mark.parametrize("name", ["b300", "gaudi2", "trillium"])
def test_the_launch_check_covers_every_feature_set_under_every_variant(m, name):
    recipe = m.recipe(name)
    checked = serve.launches(recipe, ["--max-num-seqs", "8"])
    assert len(checked) == 2 ** len(recipe["features"]) * len(recipe["variants"])
    assert len({shlex.join(argv) for _, argv in checked}) == len(checked)  # all distinct
    for label, argv in checked:
        variant, features = label.removeprefix("variant ").split(", features ")
        env = {"GEMMA4_VARIANT": variant, "GEMMA4_FEATURES": features}
        if not recipe["variants"][variant]["model"]:
            env["GEMMA4_MODEL"] = f"example/{variant}-checkpoint"
        assert argv == serve.compose(recipe, env, ["--max-num-seqs", "8"])  # what the entrypoint runs
    # The user's flags come before the limits the entrypoint adds for what the target cannot serve.
    at = {shlex.join(a): len(a) - 1 - a[::-1].index("8") for _, a in checked}
    own = [a for _, a in checked if a[: at[shlex.join(a)] - 1] + a[at[shlex.join(a)] + 1 :] == m.recipe_launch(name)]
    assert own, "the recipe's own launch is among them"


def test_launch_refusals_are_one_line_each_naming_target_flag_and_share():
    recipe = {"target": "b300", "vllm_version": "0.30.0", "features": {"reasoning": []}}
    recipe.update(variants={"default": {"model": "m"}})
    recipe.update(command=["vllm", "serve"], model_arg="positional", args=[], tokenizer=None, audio=True)
    recipe.update(default_features=[], unsupported_features={})
    refused = ["variant default, features reasoning", "unrecognized arguments: --reasoning-parserr"]
    result = {"ok": True, "value": [refused]}
    assert serve.launch_problems(recipe, result) == [
        "b300: vLLM 0.30.0 refuses the launch: unrecognized arguments: --reasoning-parserr (1 of 2 launches, "
        "e.g. variant default, features reasoning); correct the flag in targets.yaml (b300's serve.args or the "
        "feature's flags) or in the arguments given"
    ]
    assert serve.launch_problems(recipe, {"ok": True, "value": []}) == []


AVX512_AMX = "flags\t: fpu fma avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile amx_int8\n"
AVX2_ONLY = "flags\t: fpu fma avx avx2\n"  # a Xeon 6 E-core
AVX512_NO_AMX = "flags\t: fpu fma avx avx2 avx512f avx512dq avx512bw avx512vl\n"


def cpu_cache(m, tmp_path, cpuinfo: str, env: dict) -> str:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: a CPU\n{cpuinfo}")
    return serve.cpu_cache_env(m.recipe("xeon6"), {"VLLM_CACHE_ROOT": "/var/cache/vllm", **env}, str(info))


def test_the_cpu_compile_cache_is_kept_per_instruction_set(m, tmp_path):
    """Pods sharing a compile-cache claim on CPUs of other instruction sets (Xeon 6 P-cores: AVX-512
    and AMX; E-cores: AVX2) or run at another ATEN_CPU_CAPABILITY get folders of their own; the same
    CPU the same folder."""
    roots = {
        name: cpu_cache(m, tmp_path, info, env)["VLLM_CACHE_ROOT"]
        for name, info, env in [
            ("avx512_amx", AVX512_AMX, {}),
            ("again", AVX512_AMX, {}),
            ("avx2", AVX2_ONLY, {}),
            ("avx512", AVX512_NO_AMX, {}),
            ("aten_avx2", AVX512_AMX, {"ATEN_CPU_CAPABILITY": "avx2"}),
        ]
    }
    assert roots["avx512_amx"] == roots["again"]
    assert len({roots[k] for k in ("avx512_amx", "avx2", "avx512", "aten_avx2")}) == 4
    assert all(r.startswith("/var/cache/vllm/cpu-") for r in roots.values())
    assert "-avx512-" in roots["avx512_amx"] and "-avx2-" in roots["avx2"] and "-avx2-" in roots["aten_avx2"]
    # inductor's own cache dir, where the user sets one, the same way; an unset one is inductor's
    # /tmp default, per container (and per pod: /tmp is an emptyDir)
    env = cpu_cache(m, tmp_path, AVX2_ONLY, {"TORCHINDUCTOR_CACHE_DIR": "/shared/inductor/"})
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/shared/inductor/" + roots["avx2"].rsplit("/", 1)[1]
    assert "TORCHINDUCTOR_CACHE_DIR" not in cpu_cache(m, tmp_path, AVX2_ONLY, {})
    # Already keyed (a restart with the same environment): left alone; other families: untouched.
    assert cpu_cache(m, tmp_path, AVX2_ONLY, {"VLLM_CACHE_ROOT": roots["avx2"]}) == {}
    assert serve.cpu_cache_env(m.recipe("h100"), {"VLLM_CACHE_ROOT": "/var/cache/vllm"}) == {}


@pytest.mark.parametrize("name", ["trillium", "ironwood"])
def test_tpu_launches_refuse_what_vllm_tpus_jax_gemma4_cannot_serve(m, name):
    """vLLM TPU's JAX Gemma 4 has no audio tower and no video path: the recipe's launch gets both
    limited to 0 (images stay), and a launch asking for either is one line naming the reason."""
    cmd = serve.compose(m.recipe(name), {}, [])
    assert serve.mm_limits(cmd) == {"audio": 0, "video": 0}
    assert cmd[:-2] == shlex.split(m.targets[name].recipe_launch)  # the recipe's launch, then the limits
    with pytest.raises(serve.UsageError, match=f"allows video, which {name} cannot serve .vLLM TPU's JAX"):
        serve.compose(m.recipe(name), {}, ["--limit-mm-per-prompt.video", "1"])
