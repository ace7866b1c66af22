"""gemma4-images: build, run and inspect the Gemma 4 E2B IT serving images in targets.yaml.

The command line behind `python build.py` and the `gemma4-images` console script."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import click
import docker
from docker.errors import APIError

from gemma4_images.build import emulation, images, owned, pin, probe, pypi, tokenizer_copy, wheels
from gemma4_images.build import registry as registry_api
from gemma4_images.build.docker_build import (
    BaseUnavailable,
    BuildFailed,
    DockerUnavailable,
    connect,
    local_image,
    wrong_platform,
)
from gemma4_images.build.localbase import LocalBaseError
from gemma4_images.build.tokenizer_copy import TokenizerError
from gemma4_images.check import image_contents, running
from gemma4_images.generate import k8s as k8s_mod
from gemma4_images.generate import readme, render
from gemma4_images.publish import cosign, model_image, publish, reports, sbom
from gemma4_images.spec import matrix as matrix_mod
from gemma4_images.spec import platforms, upstream
from gemma4_images.spec.image_code import gemma4_serve
from gemma4_images.spec.matrix import MatrixError
from gemma4_images.spec.reference import BadReference, Reference, check_registry_spec

EXPECTED = (
    MatrixError,
    DockerUnavailable,
    BaseUnavailable,
    LocalBaseError,
    upstream.UpstreamError,
    TokenizerError,
    wheels.WheelsError,
    publish.PushError,
    pin.PinError,
    cosign.CosignError,
    registry_api.RegistryError,
    image_contents.ImageError,
    model_image.ModelImageError,
    emulation.EmulationUnavailable,
    readme.ReadmeError,
)

# push and release take the cosign key's password the same way.
COSIGN_PASSWORD_FILE = click.option(
    "--cosign-password-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="GEMMA4_COSIGN_PASSWORD_FILE",
    help="File holding the cosign key's password (else COSIGN_PASSWORD, else none).",
)

# Every command that builds or runs one platform's image takes it the same way.
PLATFORM = click.option(
    "--platform",
    metavar="OS/ARCH",
    help=f"The platform to build or run ({', '.join(platforms.KNOWN)}; default {platforms.DEFAULT}); "
    "another architecture than this host's runs under qemu.",
)


# The recipe page's strategy, the same way for `run` (one node's command) and `k8s` (a
# LeaderWorkerSet of --nodes pods per replica).
STRATEGY = click.option(
    "--strategy",
    default="single_node_tp",
    show_default=True,
    help="The recipe page's strategy: single_node_tp, or multi_node_tp over --nodes nodes (docs/run.md).",
)
NODES = click.option("--nodes", type=int, help="multi_node_tp: how many nodes the tensor parallelism spans.")

RUN_STOP_BUDGET_S = 60  # for `build.py run`'s server to stop after a signal: vLLM's graceful shutdown


def other_platform(m, name: str, platform: str | None, emulate: bool = True) -> str | None:
    """--platform for target name: one line if the target lacks it (and, with emulate, unless
    this host can run its programs), else None for the default platform and the platform's name
    for another."""
    p = m.platform(name, platform)
    if emulate:
        emulation.require(p)  # the default platform too, on a host of another architecture
    return None if p.name == platforms.DEFAULT else p.name


def no_local_image(image: str, name: str, tiny: bool = False, platform: str | None = None) -> str:
    """The line for a target's image that is not here: the exact build command that makes it."""
    vllm = click.get_current_context().meta.get("vllm")
    how = f"{name}{' --tiny' if tiny else ''}{platforms.parse(platform).option}{f' --vllm {vllm}' if vllm else ''}"
    return f"no local image {image}; build it first (`python build.py build {how}`)"


def fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def log(line: str) -> None:
    click.echo(line, err=True)


def load(name: str | None = None) -> matrix_mod.Matrix:
    """targets.yaml at the vLLM release of --vllm, else at target name's default release (its
    family's, targets.yaml `defaults`), else at the first release; read once per command and
    release (a MatrixError exits 2 through Cli.invoke)."""
    meta = click.get_current_context().meta
    views = meta.setdefault("matrices", {})
    version = meta.get("vllm")
    if version is None and name is not None:
        version = matrix_mod.default_release(load(), name)
    if version not in views:
        views[version] = matrix_mod.load(vllm=version)
    return views[version]


def _vllm_release(ctx, param, value):
    # Eager, so TargetName resolves names at this release (a target it does not build is one line).
    if value is not None:
        ctx.meta["vllm"] = value


# Every command that builds, runs or renders one target's image takes the vLLM release the same way.
VLLM = click.option(
    "--vllm",
    metavar="VERSION",
    is_eager=True,
    expose_value=False,
    callback=_vllm_release,
    help="The vLLM release to use (releases/vllm-VERSION.yaml; default: the target's family's, targets.yaml "
    "`defaults`). `list` shows each target's releases.",
)


class TargetName(click.ParamType):
    """A target name or alias, resolved here, once: commands and the modules below them get the
    canonical name. `all` stays as it is where the command takes it (see every_target)."""

    name = "target"

    def __init__(self, allow_all: bool = False):
        self.allow_all = allow_all

    def convert(self, value, param, ctx):
        if self.allow_all and value == "all":
            return value
        return load().resolve(value)  # a MatrixError is Cli.invoke's: conversion runs inside it


TARGET = TargetName()
TARGETS = TargetName(allow_all=True)


def every_target(m, names) -> list[str]:
    return list(m.targets) if not names or "all" in names else list(dict.fromkeys(names))


class Cli(click.Group):
    """The one error handler: an expected failure is one line and a non-zero exit, never a
    traceback (MatrixError and PlatformError, both bad input: 2, the rest: 1); a failed build shows
    its last lines first."""

    def invoke(self, ctx):
        try:
            with owned.stopping():
                try:
                    return super().invoke(ctx)
                except owned.Stopped as e:
                    # Still inside stopping(): a second signal stays ignored during this clean-up.
                    # The `finally` blocks on the way here removed what they hold; this removes what
                    # was between two steps (a probe container, a server not yet in its `finally`).
                    removed = 0
                    with contextlib.suppress(Exception):  # no daemon: nothing of ours can be running
                        removed = owned.remove_mine(docker.from_env())
                    click.echo(f"stopped by {e}; removed {removed} more container(s) this run had started", err=True)
                    sys.exit(128 + e.signum)
        except BuildFailed as e:
            click.echo("\n".join(f"  | {line}" for line in e.tail), err=True)
            fail(f"{e}\nno image was tagged")
        except (MatrixError, platforms.PlatformError) as e:
            fail(str(e), 2)
        except EXPECTED as e:
            fail(str(e))
        except APIError as e:
            # Whatever validation missed, the engine's refusal is one line, not a traceback.
            reason = (e.explanation or str(e)).strip().splitlines()[0]
            fail(f"the Docker engine refused: {reason}")


def parse_build_args(pairs) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"--build-arg {pair!r}: expected KEY=VALUE", 2)
        key, value = pair.split("=", 1)
        out[key] = value
    return out


def checked(check, *args):
    """A click callback: check(value, option, *args) on a value given, the option's own checker
    (an argument is named in capitals); its refusal is one line and exit 2, before the command does
    anything (an engine or a cluster would answer later, less clearly)."""

    def callback(ctx, param, value):
        if value is None:
            return None
        what = param.opts[0] if param.opts[0].startswith("-") else param.name.upper()
        try:
            check(value, what, *args)
        except (MatrixError, BadReference, model_image.ModelImageError) as e:
            fail(str(e), 2)
        return value

    return callback


def whole_number(value: int, option: str, allowed: range, why: str) -> int:
    """value when allowed holds it, else one line naming the option, the range and why."""
    if value not in allowed:
        raise MatrixError(f"{option} {value}: give {allowed[0]} to {allowed[-1]} ({why})")
    return value


reference = checked(Reference.parse)  # an image reference the engine will take
registry_spec = checked(check_registry_spec)  # HOST[:PORT][/NAMESPACE], as push takes it


def object_name(option: str, help: str, default: str | None = None, metavar: str | None = None):
    """An option naming a Kubernetes object (a claim, a Secret) the manifests refer to, checked."""
    named = {"default": default, "show_default": bool(default), "metavar": metavar}
    return click.option(option, **named, callback=checked(k8s_mod.object_name), help=help)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Build, run and inspect the gemma4-e2b images defined in targets.yaml."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_targets(as_json):
    """Every target at each vLLM release it is built on: name, family, base image, the stand-in
    `base` builds for it, vLLM version (* the release used without --vllm), tag."""
    own = load()
    views = matrix_mod.views()
    rows = [
        {
            "target": n,
            "aliases": t.aliases,
            "family": t.family,
            "hardware": t.hardware,
            "base": t.base.ref,
            "standin": t.base.standin,
            "vllm": version,
            "default": matrix_mod.default_release(own, n) == version,
            "tag": m.tag(n),
            # each platform's base and local tag (the default platform's are the two above)
            "platforms": {p: {"base": m.base_on(n, p).ref, "tag": m.tag(n, p)} for p in m.platforms(n)},
        }
        for n in own.targets
        for version, m in views.items()
        if n in m.targets
        for t in [m.targets[n]]
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    fmt = "{:<15} {:<7} {:<26} {:<44} {:<12} {:<8} {:<25} {}"
    click.echo(fmt.format("TARGET", "FAMILY", "HARDWARE", "BASE", "STAND-IN", "VLLM", "TAG", "PLATFORMS"))
    for r in rows:
        name = r["target"] + (f" ({','.join(r['aliases'])})" if r["aliases"] else "")
        standin = r["standin"] or "-"
        on = ",".join(r["platforms"])
        vllm = r["vllm"] + ("*" if r["default"] else "")
        click.echo(fmt.format(name, r["family"], r["hardware"], r["base"], standin, vllm, r["tag"], on))
    if len(views) > 1:
        click.echo("* the release `build.py` uses for the target without --vllm (targets.yaml `defaults`)")


@cli.command("render")
@click.option("--check", is_flag=True, help="Fail if the committed files differ from a fresh render.")
def render_cmd(check):
    """Write Dockerfile.<family> and image/recipes/*.json from targets.yaml and templates/."""
    m = load()
    if check:
        stale = render.drift(m)
        if stale:
            fail(
                "generated files are out of date: "
                + ", ".join(stale)
                + "\nfix: run `python build.py render` (or `make render`) and commit the result"
            )
        click.echo("generated files are up to date")
        return
    changed = render.write(m)
    click.echo("wrote " + ", ".join(changed) if changed else "nothing to change")


@cli.command("stage")
@click.option("--tokenizer-source", metavar="DIR_OR_HUB_ID", help="As for `build`.")
@VLLM
def stage_cmd(tokenizer_source):
    """Put what the Dockerfiles COPY from .build/ in place: the upstream files serve flags name (at
    the release of --vllm) and each target's BOS tokenizer copy (needed by a plain `docker build` or
    `docker buildx bake`)."""
    m = load()
    for path in pypi.stage(m):
        click.echo(path)
    for name in m.targets:
        click.echo(tokenizer_copy.stage(m, name, tokenizer_source)[0])


@cli.command()
@click.argument("targets", nargs=-1, required=True, type=TARGETS)
@click.option("--base-image", callback=reference, help="Build on this image instead of the target's base.")
@click.option("--tag", callback=reference, help="Tag to apply (default gemma4-e2b:<target>-v<vllm>); one target only.")
@click.option("--no-cache", is_flag=True)
@click.option("--dry-run", is_flag=True, help="Print the equivalent `docker build` and stop.")
@click.option("--build-arg", "build_args", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--tokenizer-source",
    metavar="DIR_OR_HUB_ID",
    help="Where the BOS tokenizer copy comes from (default: the target's model on the hub, "
    "with HF_TOKEN from the environment).",
)
@click.option(
    "--tiny",
    is_flag=True,
    help="Bake the tiny test model's tokenizer (no hub) and tag <tag>-tiny: the image `smoke --tiny` serves.",
)
@click.option("-v", "--verbose", is_flag=True, help="Stream every build step's output.")
@click.option(
    "--no-reports",
    is_flag=True,
    help="Skip writing reports/sbom-<target>.cdx.json and provenance-<target>.intoto.json "
    "(~5-10 s per changed image on 2 cores).",
)
@PLATFORM
@VLLM
def build(
    targets, base_image, tag, no_cache, dry_run, build_args, tokenizer_source, tiny, verbose, no_reports, platform
):
    """Build TARGETS (names or aliases; `all` for every target)."""
    m = load()
    names = every_target(m, targets)
    if platform is not None:
        p = platforms.parse(platform)
        if list(targets) == ["all"]:
            skipped = [n for n in names if p.name not in m.platforms(n)]
            names = [n for n in names if n not in skipped]
            if skipped:
                log(f"not built for {p.name} (their bases are published without it): {', '.join(skipped)}")
        checked = None
        for name in names:  # one line before anything is built, not after the first target
            checked = other_platform(load(name), name, p.name, emulate=not dry_run)
        platform = checked
    if tag and len(names) > 1:
        fail("--tag names one image; give one target", 2)
    extra = parse_build_args(build_args)
    if tiny and tokenizer_source:
        fail("--tiny and --tokenizer-source both name the tokenizer; give one", 2)
    if tiny:
        from testkit import tiny_model

        tokenizer_source = str(tiny_model.ensure())
    if dry_run:
        for name in names:
            click.echo(images.dry_run(load(name), name, base_image, tag, no_cache, tokenizer_source, extra, platform))
        return
    client = connect()
    for name in names:
        m = load(name)  # at its own release, unless --vllm names one
        image_tag = tag or (m.tiny_tag(name, platform) if tiny else m.tag(name, platform))
        if not no_reports and not reports.current_for_tag(
            client, reports.key(name, platform, m.report_release), image_tag
        ):
            # Its reports will be written after the build (they are kept for an unchanged image):
            # the validator imports meanwhile, not on a build that changes nothing.
            sbom.import_validator_meanwhile()
        built = images.build_target(
            client,
            m,
            name,
            base_override=base_image,
            nocache=no_cache,
            tag=image_tag,
            tokenizer_source=tokenizer_source,
            extra_args=extra,
            log=log,
            verbose=verbose,
            platform=platform,
        )
        if not no_reports:
            # what push attaches, never older than the image
            reports.for_build(client, m, name, built, log, platform)
        click.echo(built)


@cli.command("pin")
@click.argument("targets", nargs=-1)
@click.option(
    "--check",
    is_flag=True,
    help="Change nothing; exit 1 if any base's digest moved, is not pinned or cannot be resolved.",
)
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=matrix_mod.TARGETS_FILE,
    show_default="targets.yaml",
    help="The targets file to read; the release files of the releases/ folder beside it are edited.",
)
@click.option("--vllm", "release", metavar="VERSION", help="Only this release's bases (default: every release's).")
def pin_cmd(targets, check, path, release):
    """Record each base image's registry digest in its release file (TARGETS, default all, at every
    release that builds them; Gaudi's stage-1 image for gaudi2), keeping comments and layout;
    builds then pull image@digest."""
    releases_dir = path.parent / "releases"
    # TARGETS are names in --file, which may not be targets.yaml: resolved here, not by TargetName.
    views = matrix_mod.views(path, releases_dir)
    if release is not None:
        views = {release: matrix_mod.load(path, release, releases_dir)}  # an unknown one: one line, exit 2
    asked = _targets_at_any_release(views, targets)
    plans = []  # (release file, its bases)
    for version, view in views.items():
        names = [n for n in asked if n in view.targets] if asked else list(view.targets)
        if names:
            where = matrix_mod.release_file(version, releases_dir)
            plans.append((where, view, names, pin.bases(view, names, f"releases/{where.name}")))
    registry_api.binary()  # one line naming the setup command, not one per base
    results = pin.resolve([b for *_, found in plans for b in found])
    for r in results:
        click.echo(r.line())
    mismatched = [line for _, view, names, _ in plans for line in pin.disagreements(view, names, results)]
    for line in mismatched:
        click.echo(line)
    unresolved = [r for r in results if r.state in ("error", "missing")]
    if check:
        off = [r.state for r in results if r.state != "ok"]
        problems = []
        if off:
            counts = ", ".join(
                f"{n} {state}" for state in ("moved", "unpinned", "missing", "error") if (n := off.count(state))
            )
            problems.append(
                f"{len(off)} of {len(results)} bases are not pinned at the registry's digest ({counts}); "
                "check the new images, then run `python build.py pin` to pin them"
            )
        if mismatched:
            problems.append(
                f"{len(mismatched)} platform(s) where a vendor's multi-platform tag and its per-platform tag "
                "name different images (MISMATCH above); find out which one the vendor meant before building"
            )
        if problems:
            fail("; ".join(problems))
        return
    changed = []
    for where, _, _, found in plans:
        ours = {b.image for b in found}
        due = {r.base.image: r.digest for r in results if r.state in ("moved", "unpinned") and r.base.image in ours}
        changed += [f"{img} ({where.name})" for img in pin.write(where, due)] if due else []
    click.echo(
        f"pinned {len(changed)} base(s) in {releases_dir}"
        if changed
        else f"{releases_dir} already pins every digest it could resolve"
    )
    if changed and path.resolve() == matrix_mod.TARGETS_FILE.resolve():
        wrote = render.write(matrix_mod.load())
        click.echo("re-rendered " + ", ".join(wrote))
    if unresolved:
        fail(f"{len(unresolved)} base(s) could not be resolved (see above); their digests are unchanged")


def _targets_at_any_release(views: dict, names: tuple[str, ...]) -> list[str]:
    """The targets names stand for (aliases resolved) at whichever release builds them; [] for all."""
    if not names or "all" in names:
        return []
    out = []
    for name in names:
        for view in views.values():
            try:
                out.append(view.resolve(name))
                break
            except matrix_mod.MatrixError:
                continue
        else:
            next(iter(views.values())).resolve(name)  # its one-line error
    return out


@cli.command()
@click.argument("target", type=TARGET)
@click.option("--no-cache", is_flag=True)
@PLATFORM
@VLLM
def base(target, no_cache, platform):
    """Build TARGET's local stand-in base with no registry (Debian packages + a host wheelhouse)."""
    m = load(target)
    platform = other_platform(m, target, platform, emulate=False)  # checked if it must be built
    click.echo(images.build_local_base(connect(), m, target, log, nocache=no_cache, platform=platform))


@cli.command("tag")
@click.argument("target", type=TARGET)
@click.option("--tiny", is_flag=True, help="The tag of the image that bakes the tiny test model's tokenizer.")
@PLATFORM
@VLLM
def tag_cmd(target, tiny, platform):
    """Print TARGET's image tag (what `build` tags and `smoke`, `run` and `push` use)."""
    m = load(target)
    platform = m.platform(target, platform).name
    click.echo(m.tiny_tag(target, platform) if tiny else m.tag(target, platform))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("target", type=TARGET)
@click.option("--image", callback=reference, help="Image to run (default: the target's tag).")
@click.option("--print", "print_only", is_flag=True, help="Print the `docker run` line and stop.")
@click.option(
    "-e",
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    help="GEMMA4_VARIANT, GEMMA4_FEATURES, GEMMA4_MODEL or any other variable.",
)
@STRATEGY
@NODES
@click.option(
    "--node-rank", type=int, help="multi_node_tp: this node's rank (0 serves the API, the others run headless)."
)
@click.option("--master-addr", help="multi_node_tp: the address node 0 is reached at.")
@click.option(
    "--master-port",
    type=int,
    callback=checked(whole_number, gemma4_serve.PORTS, "a TCP port"),
    help=f"multi_node_tp: node 0's rendezvous port (default {gemma4_serve.DEFAULT_MASTER_PORT}).",
)
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@VLLM
def run(target, image, print_only, env, strategy, nodes, node_rank, master_addr, master_port, vllm_args):
    """Run TARGET's image with the recipe's device flags; VLLM_ARGS are appended to the launch."""
    m = load(target)
    env_map = {
        **running.strategy_env(m, target, strategy, nodes, node_rank, master_addr, master_port),
        **parse_build_args(env),
    }
    line = running.run_line(m, target, image, env_map, list(vllm_args))
    if print_only:
        click.echo(line)
        return
    ref = image or m.tag(target)
    if not running.cli_has_image(ref):  # `docker run` would ask a registry for it, even offline
        if image:
            fail(f"no local image {image}; pull or build it first (`build.py run` asks no registry)")
        tiny = m.tiny_tag(target)
        made = f": only {tiny} is here, the tiny test model's image that `smoke --tiny` serves"
        fail(no_local_image(ref, target) + (made if running.cli_has_image(tiny) else ""))
    args = [os.path.expandvars(a) for a in running.run_args(m, target, image, env_map, list(vllm_args))]
    log(line)
    child = None
    try:
        child = subprocess.Popen(args)
        sys.exit(child.wait())
    except owned.Stopped as e:
        # `docker run` passes the signal on to the container (its --sig-proxy); the server stops
        # and the engine removes it (--rm). A signal sent to this process alone would otherwise
        # leave it serving: a Kubernetes Job or `kill` reaches only us, not our child. Ctrl-C at a
        # terminal reached the child already (one process group): a second SIGINT would make the
        # server skip its graceful shutdown.
        if child is not None:
            if not (e.signum == signal.SIGINT and sys.stdin.isatty()):
                child.send_signal(e.signum)
            try:
                child.wait(timeout=RUN_STOP_BUDGET_S)
            except subprocess.TimeoutExpired:
                log(
                    f"docker run did not stop within {RUN_STOP_BUDGET_S} s of {e}; killing it "
                    "(its container may remain: see docker ps)"
                )
                child.kill()
        raise


@cli.command()
@click.argument("target", type=TARGET)
@click.option("--image", callback=reference, help="Image to test (default: the target's tag).")
@click.option("--model", help="Hub id, or a local folder mounted into the container.")
@click.option(
    "--tiny",
    is_flag=True,
    help="Serve the tiny Gemma 4 trained on a script (testkit/, no hub needed) and check its answers exactly.",
)
@click.option(
    "--report", type=click.Path(), help="JSON report path (default the reports folder's smoke-<target>.json)."
)
@PLATFORM
@VLLM
def smoke(target, image, model, tiny, report, platform):
    """Start TARGET's image, wait for it, run the recipe's checks; non-zero exit on any failure.
    Exit 3 when this machine lacks the target's accelerator (the tier is skipped, not passed)."""
    from gemma4_images.check import smoke as smoke_mod

    m, name = load(target), target
    platform = other_platform(m, name, platform)
    client = connect()
    owned.reap(client, log)
    missing = running.device_missing(client, m.families[m.targets[name].family].present)
    if missing:
        click.echo(f"SKIPPED {name}: {missing}")
        sys.exit(3)
    if tiny and model:
        fail("--tiny and --model both name the model; give one", 2)
    script = None
    if tiny:
        # Test support (testkit/): the tiny Gemma 4 trained on a script of exchanges, so the
        # answers can be checked exactly. A 1.5 MB model made to test serving, not Gemma 4.
        from testkit import exchanges, trained

        model, script = str(trained.ensure()), exchanges.EXCHANGES
    image = image or (m.tiny_tag(name, platform) if tiny else m.tag(name, platform))
    found = local_image(client, image)
    if found is None:
        fail(no_local_image(image, name, tiny, platform))
    # The report is filed under the platform asked for, which push then trusts for that platform.
    wrong = wrong_platform(found, image, platforms.parse(platform).name)
    if wrong:
        fail(wrong, 2)
    result = smoke_mod.run_smoke(client, m, name, image=image, model=model, script=script, log=log)
    path = Path(report) if report else reports.folder() / f"smoke-{reports.key(name, platform, m.report_release)}.json"
    result.write(path)
    if result.answers:
        click.echo(
            "The tiny trained model's answers (a 1.5 MB model trained on a script, to test serving, not Gemma 4):"
        )
        click.echo("\n".join(f"  {name:<16} {q} -> {a}" for name, q, a in result.answers) + "\n")
    click.echo(result.table())
    if not result.ok:
        click.echo(
            "\ncontainer log (last lines):\n" + "\n".join(f"  | {line}" for line in result.log_tail[-40:]), err=True
        )
        # The engine's own exception, which a 500 only points to and the last lines may have
        # scrolled past, goes in the one line a CI summary keeps.
        cause = f"; the server logged {result.server_errors[-1]!r}" if result.server_errors else ""
        fail(f"smoke test of {result.image} failed{cause}; report: {path}")
    click.echo(f"all checks passed; report: {path}")


@cli.command()
@click.argument("targets", nargs=-1, required=True, type=TARGET)
@click.option("--registry", required=True, metavar="HOST[:PORT]/NAMESPACE", callback=registry_spec)
@click.option("--image", callback=reference, help="Local image to push (one target only; default: the target's tag).")
@click.option("--moving-tag", is_flag=True, help="Also move the plain <target> tag.")
@click.option("--skip-smoke", is_flag=True, help="Push without a passing smoke report (loudly).")
@click.option("--allow-dirty", is_flag=True, help="Push an image built from uncommitted changes.")
@click.option(
    "--cosign-key",
    type=click.Path(dir_okay=False),
    envvar="GEMMA4_COSIGN_KEY",
    help="Sign every pushed manifest with this cosign key and attest the SBOM and provenance to each "
    "image (cosign's form, read by Kubernetes admission controllers); env GEMMA4_COSIGN_KEY.",
)
@COSIGN_PASSWORD_FILE
@click.option(
    "--platform",
    "platform_names",
    multiple=True,
    metavar="OS/ARCH[,...]",
    help="Push these platforms' images (repeat or comma-separate); two or more are joined under the "
    "target's tags by an image index. Default: every platform of the target built here.",
)
@VLLM
def push(
    targets,
    registry,
    image,
    moving_tag,
    skip_smoke,
    allow_dirty,
    cosign_key,
    cosign_password_file,
    platform_names,
):
    """Tag and push TARGETS' images, each platform's (an index joins two or more); with --cosign-key,
    sign every manifest and attest each image's reports/sbom-<target>[-<arch>].cdx.json and
    provenance-….intoto.json when present; prints each digest and records all of it in
    reports/pushed.json."""
    wanted = [p.strip() for names in platform_names for p in names.split(",")]  # an empty one is refused below
    if image and len(targets) > 1:
        fail("--image names one image; give one target", 2)
    if image and len(wanted) > 1:
        fail("--image names one platform's image; give one --platform (or push the built tags without --image)", 2)
    names = list(dict.fromkeys(targets))
    m = load(names[0])
    apart = [n for n in names[1:] if load(n) is not m]
    if apart:
        fail(
            f"{names[0]} and {', '.join(apart)} are built on different vLLM releases; push them separately "
            "or name one with --vllm",
            2,
        )
    for name in names:  # every platform checked before anything is pushed
        for p in wanted:
            m.platform(name, p)
        default = matrix_mod.default_release(load(), name)
        if moving_tag and m.project.vllm_version != default:
            fail(
                f"--moving-tag: the plain {name} tag follows {name}'s default release, vLLM {default}, not "
                f"{m.project.vllm_version}; push that release, or change defaults.{m.targets[name].family} in "
                "targets.yaml",
                2,
            )
    key = reports.key(names[0], wanted[0] if wanted else None, m.report_release)
    entries = publish.push(
        connect(),
        m,
        names,
        registry,
        platforms_wanted=wanted or None,
        moving_tag=moving_tag,
        skip_smoke=skip_smoke,
        allow_dirty=allow_dirty,
        sources={key: image} if image else None,
        cosign_key=Path(cosign_key) if cosign_key else None,
        cosign_password_file=Path(cosign_password_file) if cosign_password_file else None,
        log=log,
    )
    for entry in entries:
        click.echo(f"{entry['repository']}@{entry['digest']}")
    return entries


@cli.command()
@click.argument("ref", callback=reference)
@click.option(
    "--cosign-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The cosign public key the image, its index and its attestations must be signed by.",
)
@click.option("--attachments-dir", type=click.Path(file_okay=False), help="Write the attested in-toto Statements here.")
@click.option("--require-attachments", is_flag=True, help="Refuse an image without its SBOM and provenance.")
@click.option(
    "--platform",
    metavar="OS/ARCH",
    help=f"For a multi-platform tag: the platform's image to check (default {platforms.DEFAULT}).",
)
def verify(ref, cosign_key, attachments_dir, require_attachments, platform):
    """Check REF's cosign signature (an index's and its platform image's) and its SBOM and provenance
    attestations, as an admission controller does, before deploying it; exit 1 with the reason when
    it is refused."""
    from gemma4_images.publish import verify as verify_mod

    if platform is not None:
        platforms.parse(platform)  # before anything is asked of the registry
    result = verify_mod.verify(
        ref,
        Path(cosign_key),
        attachments_dir=Path(attachments_dir) if attachments_dir else None,
        require_attestations=require_attachments,
        platform=platform,
        log=log,
    )
    _say_verified(ref, result)


@cli.command()
@click.argument("target", type=TARGET)
@click.option("--registry", required=True, metavar="HOST[:PORT]/NAMESPACE", callback=registry_spec)
@click.option(
    "--cosign-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    envvar="GEMMA4_COSIGN_KEY",
    help="The cosign key push signs and attests with; env GEMMA4_COSIGN_KEY.",
)
@click.option(
    "--cosign-pub",
    type=click.Path(exists=True, dir_okay=False),
    help="The public key verify checks with (default: the key's file with .pub, as cosign generate-key-pair names it).",
)
@COSIGN_PASSWORD_FILE
@click.option(
    "--tiny", is_flag=True, help="Build, smoke and push the tiny test model's image (no hub, no accelerator)."
)
@click.option("--moving-tag", is_flag=True, help="Also move the plain <target> tag (its default release only).")
@click.option("--allow-dirty", is_flag=True, help="Push an image built from uncommitted changes (tagged …-dirty).")
@VLLM
@click.pass_context
def release(ctx, target, registry, cosign_key, cosign_pub, cosign_password_file, tiny, moving_tag, allow_dirty):
    """Build TARGET, smoke-test it on this machine's accelerator, push it signed and attested by
    cosign, then verify what the registry holds: the steps a release pipeline runs, in one command."""
    pub = cosign_pub or str(Path(cosign_key).with_suffix(".pub"))
    if not Path(pub).is_file():
        fail(f"no public key {pub} beside --cosign-key: give it with --cosign-pub", 2)
    ctx.invoke(build, targets=(target,), tiny=tiny, tokenizer_source=None)
    ctx.invoke(smoke, target=target, tiny=tiny)
    m = load(target)
    entries = ctx.invoke(
        push,
        targets=(target,),
        registry=registry,
        image=m.tiny_tag(target) if tiny else None,
        moving_tag=moving_tag,
        allow_dirty=allow_dirty,
        cosign_key=cosign_key,
        cosign_password_file=cosign_password_file,
    )
    for entry in entries:
        ctx.invoke(verify, ref=f"{entry['repository']}:{entry['tags'][0]}", cosign_key=pub, require_attachments=True)


def _say_verified(ref: str, result: dict) -> None:
    verified = Reference.split(ref)
    if result["index"]:
        click.echo(
            f"verified {verified.with_digest(result['index'])} ({result['platform']}: "
            f"{verified.with_digest(result['digest'])})"
        )
    else:
        click.echo(f"verified {verified.with_digest(result['digest'])}")


@cli.command()
@click.argument("target", type=TARGET)
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    callback=checked(whole_number, k8s_mod.REPLICAS, "a Deployment's replicas is an int32"),
)
@click.option("--image", callback=reference, help="Image reference (default: the last pushed digest, else the tag).")
@object_name("--pvc", "Claim for the HF cache.", default="gemma4-e2b-hf-cache")
@click.option("--no-pvc", is_flag=True, help="Keep the HF cache in an emptyDir instead.")
@object_name("--secret", "Secret holding HF_TOKEN.", default="hf-token")
@click.option(
    "--model-image",
    callback=reference,
    metavar="REF",
    help="Serve the model from this `model-image` image (an image volume) instead of the hub and its cache.",
)
@click.option(
    "--model-name",
    callback=checked(model_image.check_name),
    help="Its folder under /models (default: the last part of its repository).",
)
@STRATEGY
@NODES
@click.option(
    "--autoscale",
    metavar="MIN:MAX",
    help="Also a KEDA ScaledObject: MIN to MAX replicas on vLLM's waiting requests (and a PodDisruptionBudget).",
)
@click.option(
    "--prometheus",
    metavar="URL",
    callback=checked(k8s_mod.server_url),
    help="Where KEDA queries Prometheus (default: the Prometheus Operator's).",
)
@object_name(
    "--compile-cache-pvc",
    "Keep vLLM's compile caches on this claim, so every pod after the first starts warm (default: per pod).",
    metavar="CLAIM",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Open with why each field is what it is: where each request comes from, security, grace period, caches.",
)
@VLLM
def k8s(
    target,
    replicas,
    image,
    pvc,
    no_pvc,
    secret,
    model_image,
    model_name,
    strategy,
    nodes,
    autoscale,
    prometheus,
    compile_cache_pvc,
    explain,
):
    """Print a Kubernetes Deployment (or LeaderWorkerSet, multi_node_tp) + Service for TARGET."""
    m, name = load(target), target
    running.check_strategy(m, name, strategy, nodes)
    bounds = None
    if autoscale:
        low, _, high = autoscale.partition(":")
        if not (low.isdigit() and high.isdigit()):
            fail(f"--autoscale {autoscale!r}: give MIN:MAX, two whole numbers (e.g. 1:4)", 2)
        bounds = (int(low), int(high))
        if bounds[0] < 1:
            fail(f"--autoscale {autoscale}: MIN must be 1 or more (a replica takes minutes to start)", 2)
        if bounds[0] > bounds[1]:
            fail(f"--autoscale {autoscale}: MIN is more than MAX; give MIN <= MAX", 2)
        whole_number(bounds[1], "--autoscale MAX", k8s_mod.REPLICAS, "KEDA's maxReplicaCount is an int32")
    if model_name and not model_image:
        fail("--model-name names the folder of a --model-image; give the image too", 2)
    if model_image and not model_name:
        model_name = Reference.split(model_image).basename
    pushed = None if image else publish.pushed_entry(name)
    if pushed:
        image = publish.entry_ref(pushed)
    click.echo(
        k8s_mod.render_k8s(
            m,
            name,
            replicas,
            image=image or m.tag(name),
            # The nodes it may run on: those of what was pushed (a release of fewer platforms than
            # targets.yaml lists must not land on the others).
            image_platforms=publish.pushed_platforms(pushed) if pushed else None,
            hf_cache_pvc=None if no_pvc else pvc,
            hf_token_secret=secret,
            model_image=model_image,
            model_name=model_name,
            strategy=strategy,
            nodes=nodes,
            autoscale=bounds,
            prometheus=prometheus,
            compile_cache_pvc=compile_cache_pvc,
            explain=explain,
        ),
        nl=False,
    )


@cli.command()
@click.argument("image", callback=reference)
def inspect(image):
    """Labels, healthcheck and /etc/gemma4-e2b/build.json of a local IMAGE."""
    client = connect()
    img = local_image(client, image)
    if img is None:
        fail(f"no local image {image!r}; build it first (`python build.py build <target>`)")
    info = running.describe(img)
    info["build.json"] = probe.build_json(client, image)
    click.echo(json.dumps(info, indent=2))


@cli.command("bench")
@click.option("--no-build", "skip_build", is_flag=True, help="Skip the build-system benchmark.")
@click.option("--no-serving", "skip_serving", is_flag=True, help="Skip the serving harness run.")
@click.option(
    "--no-startup",
    "skip_startup",
    is_flag=True,
    help="Skip the start-up benchmark (our image against bare vllm serve, ~6 min).",
)
@click.option("--no-load", "skip_load", is_flag=True, help="Skip the load, client-fault and stop benchmark.")
@click.option(
    "--no-pod",
    "skip_pod",
    is_flag=True,
    help="Skip what a pod needs: memory at two KV cache sizes and start-up with the compile-cache volume (~7 min).",
)
@click.option(
    "--with-base", is_flag=True, help="Also time a no-cache build of the local CPU base (~3.5 min; re-tags the base)."
)
@click.option(
    "--quickstart",
    is_flag=True,
    help="Also time `make quickstart` cold and warm: a fresh clone, a second Docker daemon, empty caches (~10 min).",
)
@click.option(
    "--standins",
    is_flag=True,
    help="Also build each stand-in base and one image on it with no cache, under throwaway tags (~15 min).",
)
@click.option(
    "--tests",
    is_flag=True,
    help="Also time `make test` in a fresh clone, in two lanes and in one (the baseline; ~30 min).",
)
@click.option(
    "--tests-fresh",
    is_flag=True,
    help="Also time `make test` as a fresh machine runs it: the project's images removed and the engine's "
    "whole build cache emptied first (~40 min, ~60 GB of disk; `make test-fresh`).",
)
@click.option(
    "--releases",
    is_flag=True,
    help="Also run the start-up and load benchmarks at every vLLM release xeon6 is built on, side by side "
    "(each release's tiny image built first; ~6 min per release).",
)
@click.option(
    "--fullsize",
    is_flag=True,
    help="Also serve random weights of E2B's shape (10.2 GB, written once to the machine cache) with the "
    "recipe's launch: start-up, memory, tokens/s, fast prefill against stock (~25 min; needs 20 GiB of memory).",
)
@click.option(
    "--model-image",
    is_flag=True,
    help="Also pack E2B's shape with `model-image`, push it to a loopback registry, pull it back and serve it "
    "with --network none (~15 min; needs ~34 GB of free disk).",
)
def bench_cmd(
    skip_build,
    skip_serving,
    skip_startup,
    skip_load,
    skip_pod,
    with_base,
    quickstart,
    standins,
    tests,
    tests_fresh,
    releases,
    fullsize,
    model_image,
):
    """Cold/no-change/one-patch/one-entrypoint-line rebuilds, image overhead, gemma4-bench in the CPU
    image with the tiny model, and start-up time against bare vllm serve; regenerates BENCHMARKS.md
    (the parts not run keep their last figures, from benchmarks.json)."""
    from gemma4_images.bench import suite  # imports testkit: the commands that serve the test model only

    try:
        results = suite.main(
            log,
            build=not skip_build,
            serving=not skip_serving,
            with_base=with_base,
            startup=not skip_startup,
            load=not skip_load,
            pod=not skip_pod,
            quickstart=quickstart,
            standins=standins,
            tests=tests,
            tests_fresh=tests_fresh,
            releases=releases,
            fullsize=fullsize,
            model_image=model_image,
        )
    except RuntimeError as e:  # a benchmark that could not measure what it set out to
        fail(str(e))
    build = results.get("build")
    if build and not all(s["layers_ok"] for s in build["scenarios"][1:]):
        fail("a rebuild rebuilt the wrong layers (see above and BENCHMARKS.md)")


@cli.command("contract")
@click.argument("target", type=TARGET)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Default reports/contract-<target>[-v<release>].cst.yaml (`build` writes it too).",
)
@VLLM
def contract_cmd(target, out):
    """Write what TARGET's image promises (entrypoint, labels, env, files, the recipe's launch, its
    fixes applied, pinned versions) as a container-structure-test config: `container-structure-test
    test --image IMAGE --config FILE` checks an image with it, without this project."""
    m = load(target)
    path = out or reports.contract_path(reports.key(target, None, m.report_release))
    try:
        click.echo(reports.write_contract(m, target, path))
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror or e}")


@cli.command("sbom")
@click.argument("target", type=TARGET)
@click.option("--image", callback=reference, help="Built image to describe (default: the target's tag).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Default reports/sbom-<target>[-v<release>].cdx.json.",
)
@VLLM
def sbom_cmd(target, image, out):
    """Write a CycloneDX 1.6 SBOM of TARGET's built image: OS packages, Python distributions, the
    base image, our files, and each applied fix as a pedigree patch; checked against the schema and
    against the image's fixes label and /etc/gemma4-e2b/fixes.json before it is written."""
    m = load(target)
    contents = image_contents.read(connect(), m, target, image or m.tag(target))
    try:
        click.echo(reports.write_sbom(contents, reports.key(target, None, m.report_release), out))
    except image_contents.ImageError as e:
        fail(f"{e}; no SBOM was written")


@cli.command("provenance")
@click.argument("target", type=TARGET)
@click.option("--image", callback=reference, help="Built image to describe (default: the target's tag).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Default reports/provenance-<target>[-v<release>].intoto.json.",
)
@click.option(
    "--verify",
    "verify_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Check this provenance against the image instead of writing one.",
)
@VLLM
def provenance_cmd(target, image, out, verify_path):
    """Write an in-toto Statement v1 with a SLSA provenance v1 predicate for TARGET's built image
    (subject: its digest; dependencies: base digest, git revision, fix diffs, tokenizer source,
    upstream files; builder and parameters from /etc/gemma4-e2b/build.json)."""
    from gemma4_images.publish import provenance

    m = load(target)
    contents = image_contents.read(connect(), m, target, image or m.tag(target))
    if verify_path:
        try:
            document = json.loads(verify_path.read_text())
        except ValueError as e:
            fail(f"{verify_path} is not JSON ({e})")
        problems = provenance.mismatches(document, contents, m)
        if problems:
            fail(f"{verify_path} does not describe {contents.ref}:\n  " + "\n  ".join(problems))
        click.echo(f"{verify_path} matches {contents.ref} ({contents.id})")
        return
    click.echo(reports.write_provenance(contents, m, reports.key(target, None, m.report_release), out))


@cli.command()
@click.argument("names", nargs=-1, metavar="FAMILY|TARGET...")
@click.option("--vllm", "version", metavar="VERSION", help="The vLLM release to add (e.g. 0.32.0).")
@click.option(
    "--drop",
    "drops",
    multiple=True,
    metavar="FIX=WHY",
    help="Leave a vLLM-level fix out of VERSION's profile, saying why: the upstream change that fixed it "
    "(its tests passed on VERSION's own code), or why the family never runs the code it changes "
    "(recorded in the release file).",
)
@click.option(
    "--accept-merge",
    "accepts",
    multiple=True,
    metavar="FIX",
    help="Take git's clean merge of FIX where upstream changed lines of its context (bump shows them: read "
    "them first).",
)
@click.option(
    "--override",
    "overrides",
    multiple=True,
    metavar="REQUIREMENT=WHY",
    help="Pin REQUIREMENT (NAME==VERSION) in the release's stand-ins in place of what its vLLM pins, saying "
    "why (e.g. the pinned release is not on the index); recorded in the release file.",
)
@click.option("--check", is_flag=True, help="Only say which families' vLLM has a newer release on the index (exit 1).")
def bump(names, version, drops, accepts, overrides, check):
    """Build FAMILY's targets (or the TARGETs) on vLLM VERSION beside their own release: writes
    releases/vllm-VERSION.yaml, the stand-ins' locks, the fixes' ports and profile, the recipes and
    FIXES.md, and prints what changed; a failure leaves the tree as it was."""
    from gemma4_images.build import bump as bump_mod

    if check:
        behind = bump_mod.behind(matrix_mod.views(), log=click.echo)
        if behind:
            fail("behind the package index: " + "; ".join(behind))
        click.echo("every family is on the newest vLLM release on the package index")
        return
    if not names or not version:
        fail("give FAMILY (or TARGETs) and --vllm VERSION, e.g. `build.py bump cpu --vllm 0.32.0`", 2)
    m = load()
    dropped = {}
    for pair in drops:
        fix, _, why = pair.partition("=")
        if not why.strip():
            fail(f"--drop {pair!r}: say why: --drop {fix}=<the upstream change that fixed it, or why it never runs>", 2)
        dropped[fix] = why.strip()
    pinned = {}
    for pair in overrides:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+)=(.*\S.*)", pair, re.S)
        if not found:
            fail(f"--override {pair!r}: give NAME==VERSION=WHY, e.g. --override 'flashinfer-python==0.7.4=<why>'", 2)
        pinned[found[1]] = found[2].strip()
    for name in names:
        if name not in m.families:
            try:
                m.resolve(name)  # before anything is asked of the index
            except MatrixError as e:
                fail(f"{e}; or a family: {', '.join(m.families)}", 2)
    dirty = bump_mod.uncommitted()
    if dirty:
        fail(f"uncommitted changes to files bump writes: {', '.join(dirty)}; commit or stash them first", 2)
    try:
        p = bump_mod.plan(m, list(names), version, dropped, accepts, log=log, overrides=pinned)
        written = bump_mod.write(p, log=log)
    except bump_mod.BumpError as e:
        fail(f"{e}; nothing was changed", e.code)
    except upstream.UpstreamError as e:  # the package index, or vLLM's source archive
        fail(f"{e}; nothing was changed")
    click.echo(bump_mod.table(p))
    click.echo("wrote " + ", ".join(written))


@cli.command("policy")
@click.argument("repository")
@click.option(
    "--cosign-key", "key", required=True, type=click.Path(path_type=Path), help="The cosign public key (cosign.pub)."
)
@click.option(
    "--out",
    "folder",
    default="containers",
    show_default=True,
    type=click.Path(path_type=Path),
    help="Where policy.json and registries.d/ are written (for /etc/containers/ on a node).",
)
def policy_cmd(repository, key, folder):
    """Write the containers-policy.json and registries.d entry with which podman, CRI-O and skopeo
    accept REPOSITORY's images only when cosign-signed by the key (`push --cosign-key`)."""
    from gemma4_images.publish import sigstore_policy

    try:
        pem = key.read_text()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--cosign-key {key}: {getattr(e, 'strerror', None) or 'not a text file'}", 2)
    try:
        written = sigstore_policy.write(folder, repository, pem, str(key))
    except sigstore_policy.PolicyError as e:
        fail(str(e), 2)
    click.echo("wrote " + ", ".join(str(p) for p in written))


@cli.command()
@click.argument("family")
@click.option("--vllm", "version", required=True, metavar="VERSION", help="The release to make FAMILY's default.")
@click.option("--source", required=True, metavar="WHY", help="Why: the recipe's line, and what proves it here.")
def promote(family, version, source):
    """Make vLLM VERSION FAMILY's default release (targets.yaml `defaults`): what every command
    builds without --vllm and the plain <target> tag follow it; the generated files are rendered."""
    from gemma4_images.build import lifecycle

    families = load().families
    if family not in families:
        fail(f"{family} is not a family ({', '.join(families)})", 2)
    try:
        written = lifecycle.promote(family, version, source)
    except lifecycle.BumpError as e:  # bad input (exit 2), or git could not say what changed
        fail(f"{e}; nothing was changed", e.code)
    click.echo("wrote " + ", ".join(written))


@cli.command()
@click.option("--vllm", "version", required=True, metavar="VERSION", help="The release to remove.")
def retire(version):
    """Remove vLLM VERSION's release: its releases/ file, its stand-ins' locks, its fixes profiles
    and ports, its recipes; the generated files are rendered again. Refused for a family's default."""
    from gemma4_images.build import lifecycle

    try:
        removed = lifecycle.retire(version)
    except lifecycle.BumpError as e:
        fail(f"{e}; nothing was changed", e.code)
    click.echo("changed " + ", ".join(removed))


# -- model images: the model's files as an image, served with no hub at run time ----------------


@cli.command("model-image")
@click.argument("source")
@click.option(
    "--name",
    callback=checked(model_image.check_name),
    help="Folder under /models and image name (default: from SOURCE).",
)
@click.option("--revision", help="Hub branch, tag or commit to download (hub ids only; default main).")
@click.option(
    "--tag", "image_tag", callback=reference, help="Local image reference (default gemma4-e2b-models/NAME:REVISION)."
)
@click.option(
    "--registry",
    metavar="HOST[:PORT][/NAMESPACE]",
    callback=registry_spec,
    help="Also push to REGISTRY/models/NAME:REVISION (digest recorded in reports/pushed.json).",
)
def model_image_cmd(source, name, revision, image_tag, registry):
    """Pack SOURCE (a model folder, or a hub id downloaded with HF_TOKEN from the environment) into
    an image holding only its files at /models/NAME, tagged by the model's revision."""
    client = connect()
    if registry:  # before the build: an unreachable registry is found in a second, not after
        publish.check_registry(publish.split_registry(registry)[0])
    built = model_image.build(client, source, name=name, revision=revision, tag=image_tag, log=log)
    log(f"{built.ref}: {built.path} at {built.revision} ({built.image_id[:19]})")
    click.echo(built.ref)
    if registry:
        entry = model_image.push(client, built.ref, registry, log=log, check=False)
        click.echo(f"{entry['repository']}@{entry['digest']}")


def main():
    cli()


if __name__ == "__main__":
    main()
