"""Build one target's image: pick its base, gather its facts (gemma4_images.facts), build it."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from gemma4_images.build import emulation, localbase, probe, pypi, tokenizer_copy, wheels
from gemma4_images.build.docker_build import (
    BaseUnavailable,
    BuildSpec,
    base_digest,
    build,
    connect,
    local_image,
    pull,
    wrong_platform,
)
from gemma4_images.spec import platforms
from gemma4_images.spec.facts import build_args
from gemma4_images.spec.matrix import ROOT, Matrix, dockerfile_name

# The base's Python as pip needs it to choose wheels: version, machine and glibc.
PYTHON_OF = (
    "import json, platform, sys; print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'machine': platform.machine(), 'glibc': platform.libc_ver()[1]}))"
)


def resolve_base(client, matrix: Matrix, name: str, override: str | None, log, platform: str | None = None) -> str:
    """The base to build on for platform (None: the default), present locally. Order:
    --base-image; the vendor base (local or pulled); the target's local stand-in when the vendor
    base cannot be pulled."""
    target = matrix.targets[name]
    wanted = override or matrix.base_on(name, platform).ref
    found = local_image(client, wanted)
    if found is not None:
        # A base of another platform would build an image of the one asked for on its binaries.
        wrong = wrong_platform(found, wanted, platform or platforms.DEFAULT)
        if wrong:
            raise BaseUnavailable(f"base {wrong}")
        return wanted
    if target.stage1 and not override:
        log(f"{wanted} is not here: building Gaudi stage 1 ({dockerfile_name('gaudi-vllm')}) first")
        build(client, BuildSpec(dockerfile=dockerfile_name("gaudi-vllm"), tag=wanted, context=ROOT, buildargs={}), log)
        return wanted
    reason = pull(client, wanted, emulation.engine_platform(platforms.parse(platform)))
    if reason is None:
        return wanted
    standin = None if override else matrix.standin(name, platform)
    local = standin.tag if standin else None
    if local and local_image(client, local) is not None:
        log(f"cannot pull {wanted} ({reason}); using the local stand-in {local}")
        return local
    on = f" --platform {platform}" if platform else ""
    hint = (
        f"build the local stand-in with `python build.py base {name}{on}` (air-gapped, no registry)"
        if local
        else "pass --base-image with an image that is present locally"
    )
    raise BaseUnavailable(f"cannot pull {wanted}: {reason}. {hint[0].upper() + hint[1:]}.")


def audio_wheels(client, matrix: Matrix, name: str, base: str, log, extras: str | None = None) -> Path | None:
    """The audio extras' wheelhouse for the base's own Python and platform (None: no audio).
    extras: what the build installs instead of the target's own (a GEMMA4_AUDIO_EXTRAS build arg;
    empty: nothing)."""
    if not matrix.targets[name].audio or extras == "":
        return None
    py = probe.python(client, base, PYTHON_OF)
    platforms = wheels.manylinux_platforms(py["machine"], py["glibc"])
    wanted = matrix.audio_extras_of(name) if extras is None else extras.split()
    house = wheels.wheelhouse(wanted, python=py["python"], platforms=platforms)
    log(f"audio extras for Python {py['python']} ({py['machine']}, glibc {py['glibc']}) from {house}")
    return house


def build_target(
    client,
    matrix: Matrix,
    name: str,
    *,
    base_override=None,
    tag=None,
    nocache=False,
    tokenizer_source=None,
    extra_args=None,
    log=print,
    verbose=False,
    context=ROOT,
    on_spec=None,
    platform=None,
) -> str:
    """Build name's image for platform (None: the default) from the build context (the repository,
    or a copy of its image inputs). on_spec, if given, sees the BuildSpec before the build (bench
    reports which build args moved)."""
    p = matrix.platform(name, platform)  # refused here, before anything is staged or pulled
    platform = None if p.name == platforms.DEFAULT else p.name  # what tags and stand-ins are named by
    emulation.require(p)  # another architecture than the host's (linux/amd64 too, on an arm64 host)
    tag = tag or matrix.tag(name, platform)
    pypi.stage(matrix, context / ".build" / "upstream")
    _, bos_copy_of = tokenizer_copy.stage(matrix, name, tokenizer_source, context / ".build" / "tokenizer")
    base = resolve_base(client, matrix, name, base_override, log, platform)
    image = local_image(client, base)
    house = audio_wheels(client, matrix, name, base, log, (extra_args or {}).get("GEMMA4_AUDIO_EXTRAS"))
    with wheels.serve_directory(house) if house else nullcontext("") as wheels_url:
        buildargs = build_args(matrix, name, base, base_digest(image, base), wheels_url, bos_copy_of, extra_args)
        spec = BuildSpec(
            dockerfile=dockerfile_name(matrix.targets[name].family),
            tag=tag,
            buildargs=buildargs,
            context=context,
            nocache=nocache,
            platform=emulation.engine_platform(p),
        )
        if on_spec:
            on_spec(spec)
        log(f"building {tag} ({spec.dockerfile} on {base})")
        build(client, spec, log, verbose=verbose)
    return tag


def dry_run(
    matrix: Matrix,
    name: str,
    base_override=None,
    tag=None,
    nocache=False,
    tokenizer_source=None,
    extra_args=None,
    platform=None,
) -> str:
    """The build as a command, without touching the engine (base digest shown as a placeholder)."""
    target = matrix.targets[name]
    on = matrix.base_on(name, platform)
    base = base_override or on.ref
    bos = (tokenizer_source or matrix.project.model) if target.bos_tokenizer else ""
    buildargs = build_args(matrix, name, base, on.digest or "<resolved at build>", "<served at build>", bos, extra_args)
    return BuildSpec(
        dockerfile=dockerfile_name(target.family),
        tag=tag or matrix.tag(name, platform),
        buildargs=buildargs,
        context=ROOT,
        nocache=nocache,
        platform=emulation.engine_platform(matrix.platform(name, platform)),
    ).command_line()


def build_local_base(client, matrix: Matrix, name: str, log, nocache=False, platform=None) -> str:
    base = matrix.base_on(name, platform)
    if not base.standin:
        on = f" for {platform}" if platform else ""
        others = ", ".join(
            f"{n} ({matrix.base_on(n, platform).standin})"
            for n in matrix.targets
            if (platform or platforms.DEFAULT) in matrix.platforms(n) and matrix.standin(n, platform)
        )
        why = base.no_standin or "targets.yaml names none for it"
        raise BaseUnavailable(
            f"{name} has no local stand-in base{on}: {why}. Stand-ins{on}, by target: {others}; "
            "build one and pass it with --base-image"
        )

    def prefetch(rootfs: str) -> None:
        # What the image build then finds in the machine cache (the audio extras' wheelhouse, the
        # vLLM sdist the upstream files come from); a failure here is the image build's to report
        # (it tries again), not the base's.
        for what, fetch in (
            ("the audio extras", lambda: audio_wheels(connect(), matrix, name, rootfs, log)),
            ("the upstream files", lambda: pypi.stage(matrix)),
        ):
            try:
                fetch()
            except Exception as e:  # noqa: BLE001 - a download ahead of time, never the base's failure
                log(f"note: fetching {what} ahead of the image build failed ({e}); the build fetches them again")

    return localbase.standin_base(client, matrix, base.standin, log, nocache=nocache, prefetch=prefetch)
