"""The image's entrypoint: the launch it builds for every target, the run-time choices and the
recipe's "what not to do" guards. These import the very file the images run."""
import json

import pytest

from gemma4_images import matrix
from gemma4_images.entrypoint import gemma4_serve as serve


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
    assert serve.compose(r, {"GEMMA4_FEATURES": "none"}, []) == ["vllm", "serve", "google/gemma-4-E2B-it",
                                                               "--tensor-parallel-size", "1"]


@pytest.mark.parametrize("spec, match", [("telepathy", "unknown feature 'telepathy'"),
                                         ("reasoning,+text_only", "mixes names")])
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
    assert run_main(tmp_path, monkeypatch, m.recipe("gaudi2"), ["--print-command"],
                    {"VLLM_SKIP_WARMUP": "false"}) == 2
    assert "VLLM_SKIP_WARMUP" in capsys.readouterr().err


def test_self_check_reports_missing_files_and_vllm(m, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problems = serve.self_check(m.recipe("h100"))
    assert any("examples/tool_chat_template_gemma4.jinja" in p for p in problems)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "tool_chat_template_gemma4.jinja").write_text("{{ messages }}")
    assert not any("jinja" in p for p in serve.self_check(m.recipe("h100")))


def test_flag_value_forms():
    assert serve.flag_value(["--port", "1", "--port=2"], "--port") == "2"
    assert serve.flag_value(["--port", "9"], "--port") == "9"
    assert serve.flag_value(["--portal", "9"], "--port") is None


def test_build_info_uses_the_label_table(tmp_path):
    out = tmp_path / "etc" / "build.json"
    serve.write_build_info(str(out), {"GEMMA4_TARGET": "h100", "GEMMA4_REVISION": "abc"})
    data = json.loads(out.read_text())
    assert set(data) == set(serve.BUILD_FACTS)
    assert data["io.gemma4-images.target"] == "h100"
    assert data["org.opencontainers.image.revision"] == "abc"
