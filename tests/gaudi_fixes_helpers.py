"""Helpers for the tests of the vllm_gaudi-level fixes (tests/unit/test_gaudi_fix_*.py).

Every test imports vllm-gaudi code from a checkout named by the environment
variable ``VLLM_GAUDI_SRC``, against an importable vllm 0.30.0, once as upstream
has it and once with the pack's fixes applied by the pack's own applier
(``patches/apply_all.py``, exact placement, no fuzz): the code under test is the
patched file itself, never the diff's text. Without a checkout or vLLM the tests
skip, or fail when ``GEMMA4_GAUDI_FIXES_NO_SKIP=1`` (what check-fixes and CI's
tests/integration/test_gaudi_fix_reproductions.py set). ``GEMMA4_FIXES_PACK``
points them at another pack directory (the hunk-coverage check's mutants).

The only HPU-only import of hpu_input_batch.py is ``vllm_gaudi.utils`` (which
imports habana_frameworks). The stub put in its place holds that module's own
``async_h2d_copy`` / ``async_h2d_update``, read from the checkout's utils.py
with ``ast`` and bound to ``device="cpu"``.
"""

import ast
import functools
import importlib
import json
import linecache
import os
import sys
import textwrap
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACK = os.environ.get("GEMMA4_FIXES_PACK") or os.path.join(REPO, "patches")
PROFILE = "vllm-gaudi-0.30.0"


def load_applier():
    from gemma4_images.spec.modules import load_file

    return load_file("_gaudi_fixes_apply_all", os.path.join(PACK, "apply_all.py"))


def gaudi_fixes():
    """The pack's vllm_gaudi fixes that exist, in pack order (the profile's order)."""
    with open(os.path.join(PACK, "profiles", PROFILE + ".json"), encoding="utf-8") as f:
        prof = json.load(f)
    names = []
    for name in prof["generic"] + prof["opt_in"]:
        path = os.path.join(PACK, name, "fix.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                if json.load(f)["package"] == "vllm_gaudi":
                    names.append(name)
    return names


def fix_diff(name):
    with open(os.path.join(PACK, name, "fix.diff"), encoding="utf-8") as f:
        return f.read()


# ------------------------------------------------------------ checkout-based tests
def unavailable(reason):
    """Skip, or fail when GEMMA4_GAUDI_FIXES_NO_SKIP=1: a reproduction that did not run proves nothing."""
    if os.environ.get("GEMMA4_GAUDI_FIXES_NO_SKIP") == "1":
        pytest.fail(f"{reason} (GEMMA4_GAUDI_FIXES_NO_SKIP=1: a skipped reproduction is a failure)", pytrace=False)
    pytest.skip(reason)


def gaudi_src_or_skip():
    src = os.environ.get("VLLM_GAUDI_SRC")
    if not src:
        unavailable(
            "VLLM_GAUDI_SRC is not set (needs a vllm-gaudi checkout: make check-fixes, or CI's "
            "tests/integration/test_gaudi_fix_reproductions.py)"
        )
    if not os.path.isfile(os.path.join(src, "vllm_gaudi", "v1", "worker", "hpu_input_batch.py")):
        unavailable(f"VLLM_GAUDI_SRC={src} is not a vllm-gaudi checkout")
    return src


def vllm_or_skip():
    try:
        import vllm  # noqa: F401
        import vllm.v1.sample.metadata  # noqa: F401

        missing = None
    except Exception as err:  # pragma: no cover - depends on the environment
        missing = f"{type(err).__name__}: {err}"
    if missing:
        unavailable(f"vllm is not importable here ({missing}); run with a vllm 0.30.0 venv")
    import vllm

    if not vllm.__version__.startswith("0.30.0"):
        unavailable(f"needs vllm 0.30.0, found {vllm.__version__}")


def import_or_skip(name):
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing = str(err)
    unavailable(f"{name} is not importable here ({missing})")


def checkout_or_skip():
    """The vllm-gaudi checkout named by VLLM_GAUDI_SRC, with vllm 0.30.0 importable; else skip."""
    src = gaudi_src_or_skip()
    vllm_or_skip()
    return src


@pytest.fixture(scope="module")
def src():
    """checkout_or_skip() as a fixture: test modules import it (check-fixes runs them with --noconftest)."""
    return checkout_or_skip()


def file_text(src, path, fixes=(), exact=True):
    """`path` from the checkout, with `fixes` (pack names) applied in pack order.

    exact: each hunk must match at its stated line (true when all earlier fixes
    of the pack on this file are applied too); otherwise the applier's unique
    exact match elsewhere (an offset, never fuzz) is accepted."""
    return _file_text(src, path, tuple(fixes), exact)


@functools.lru_cache(maxsize=None)  # the pack and the checkout do not change while tests run
def _file_text(src, path, fixes, exact):
    applier = load_applier()
    with open(os.path.join(src, path), encoding="utf-8") as f:
        lines = applier.split_lines(f.read())
    for name in [n for n in gaudi_fixes() if n in fixes]:
        hunks = applier.parse_diff(fix_diff(name), f"fix {name}").get(path)
        if hunks:
            lines, notes = applier.apply_hunks(lines, hunks)
            assert not (exact and notes), f"fix {name} applies only at an offset: {notes}"
    return "".join(lines)


def compile_patched(code, src, path, fixes, whole=None):
    """compile() of code from a checkout file (`whole`: the file's patched text, when `code` is a
    part of it placed at its own line numbers); with fixes, under a name of its own whose lines
    tracebacks show from the patched text (the file on disk has other line numbers)."""
    filename = os.path.join(src, path) + (" (with the pack's fixes)" if fixes else "")
    if fixes:
        text = whole if whole is not None else code
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    return compile(code, filename, "exec")


def _cpu_utils_stub(src):
    """A `vllm_gaudi.utils` holding the checkout's own async_h2d_* bound to CPU."""
    with open(os.path.join(src, "vllm_gaudi", "utils.py"), encoding="utf-8") as f:
        text = f.read()
    wanted = {"async_h2d_copy", "async_h2d_update"}
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in nodes} == wanted, "vllm_gaudi/utils.py lacks async_h2d_copy/async_h2d_update"
    import torch

    ns = {"torch": torch}
    for node in nodes:
        exec(compile(ast.get_source_segment(text, node), "vllm_gaudi/utils.py", "exec"), ns)
    stub = types.ModuleType("vllm_gaudi.utils")
    for name in wanted:
        setattr(stub, name, functools.partial(ns[name], device="cpu"))
    return stub


def load_input_batch(src, fixes=(), exact=True):
    """Import hpu_input_batch.py from the checkout (with `fixes` applied) on CPU."""
    path = "vllm_gaudi/v1/worker/hpu_input_batch.py"
    code = compile_patched(file_text(src, path, fixes, exact), src, path, fixes)
    saved = {k: sys.modules.get(k) for k in ("vllm_gaudi", "vllm_gaudi.utils")}
    pkg = types.ModuleType("vllm_gaudi")
    pkg.__path__ = []
    sys.modules["vllm_gaudi"], sys.modules["vllm_gaudi.utils"] = pkg, _cpu_utils_stub(src)
    try:
        module = types.ModuleType("hpu_input_batch_under_test")
        module.__file__ = os.path.join(src, path)
        exec(code, module.__dict__)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module


def make_batch(mod, max_num_reqs=4, vocab_size=32, logitsprocs=None):
    import torch

    return mod.InputBatch(
        max_num_reqs=max_num_reqs,
        max_model_len=64,
        max_num_batched_tokens=64,
        device=torch.device("cpu"),
        pin_memory=False,
        vocab_size=vocab_size,
        block_sizes=[16],
        kernel_block_sizes=[16],
        logitsprocs=logitsprocs,
    )


def make_request(mod, req_id, prompt, output=(), **sampling):
    from vllm.sampling_params import SamplingParams

    bad_words = sampling.pop("bad_words_token_ids", None)
    params = SamplingParams(**sampling)
    if bad_words is not None:
        params._bad_words_token_ids = bad_words  # what update_from_tokenizer() sets
    return mod.CachedRequestState(
        req_id=req_id,
        prompt_token_ids=list(prompt),
        mm_features=[],
        sampling_params=params,
        generator=None,
        block_ids=[[0]],
        num_computed_tokens=0,
        output_token_ids=list(output),
    )


@functools.lru_cache(maxsize=16)
def _parsed(text):
    return ast.parse(text)


def defs_from_file(src, path, fixes, names, namespace, cls=None, exact=True):
    """Compile the top-level definitions `names` of `path` (functions and classes
    with their decorators, and simple assignments; or, with `cls`, the methods of
    that class, as plain functions taking `self`) from the checkout with `fixes`
    applied, in file order; return {name: object}. Names the file lacks are left
    out. Only those definitions run: the module's imports do not."""
    text = file_text(src, path, fixes, exact)
    lines = text.splitlines(keepends=True)
    body = _parsed(text).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    ns = dict(namespace)
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        if set(defined) & set(names):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            # blank lines first, so tracebacks name the file's own line numbers
            source = "\n" * (first - 1) + textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))
            exec(compile_patched(source, src, path, fixes, whole=text), ns)
    return {name: ns[name] for name in names if name in ns}


def defs(src, path, fixes, names, namespace=None, cls=None):
    """defs_from_file's objects for `names`, in that order, failing if the file lacks one."""
    found = defs_from_file(src, path, fixes, names, dict(namespace or {}), cls=cls)
    assert set(found) == set(names), f"{path} with {list(fixes)} lacks {set(names) - set(found)}"
    return [found[n] for n in names]
