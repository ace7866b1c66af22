"""Push built images to a registry: gated on their smoke report, skipped when the registry already
holds the same digest, and with a cosign key every manifest signed and the target's SBOM and
provenance attested to its image (cosign.py), all of it recorded in reports/pushed.json."""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from gemma4_images.build import registry as registry_api
from gemma4_images.build.docker_build import ANSI, local_image, wrong_platform
from gemma4_images.publish import cosign, index, reports, sigstore_policy
from gemma4_images.spec import facts, platforms, reference
from gemma4_images.spec.matrix import Matrix

SHORT_SHA = 7
PUSHED_FILE = "pushed.json"


class PushError(Exception):
    """A push that cannot or must not happen; the message is one line saying why and what to do."""


class RegistryUnavailable(PushError):
    pass


def split_registry(registry: str) -> tuple[str, str]:
    """'HOST[:PORT][/NAMESPACE]' -> (host, namespace). A registry must name its host: a bare
    namespace would send the image to Docker Hub, which nobody means by --registry."""
    try:
        reference.check_registry_spec(registry)
    except reference.BadReference as e:
        raise PushError(str(e)) from None
    host, _, namespace = registry.strip().rstrip("/").partition("/")
    return host, namespace


def registry_path(registry: str, *path: str) -> str:
    """HOST[/NAMESPACE]/PATH...: where an image goes in the registry."""
    host, namespace = split_registry(registry)
    return "/".join(p for p in (host, namespace, *path) if p)


def repository(matrix: Matrix, registry: str) -> str:
    return registry_path(registry, matrix.project.image)


def short_revision(image, allow_dirty: bool) -> str:
    """The commit the image was built from (its revision label; the checkout's when the image has
    none), shortened. HEAD may have moved since the build, so the label is the truth."""
    full = (image.labels or {}).get("org.opencontainers.image.revision") or facts.revision()
    sha, dirty = full.removesuffix("-dirty"), full.endswith("-dirty")
    if sha == "unknown" or not sha:
        raise PushError(
            "the image records no git revision, so it cannot get a -v<vllm>-<sha> tag; build it from a git checkout"
        )
    if dirty and not allow_dirty:
        raise PushError(
            f"the image was built from uncommitted changes (revision {sha[:SHORT_SHA]}-dirty); "
            "commit and rebuild, or pass --allow-dirty to push it tagged …-dirty"
        )
    return sha[:SHORT_SHA] + ("-dirty" if dirty else "")


def tags_for(matrix: Matrix, name: str, revision: str, moving_tag: bool, suffix: str = "") -> list[str]:
    """The registry tags of a target's image: its version, the version and commit, and (moving_tag)
    the plain name; suffix names one platform's image (-arm64) where the plain tags are an index."""
    version = matrix.version_name(name)
    return [f"{version}{suffix}", f"{version}-{revision}{suffix}"] + ([f"{name}{suffix}"] if moving_tag else [])


# -- the smoke gate ------------------------------------------------------------------------------


def smoke_refusal(
    client, name: str, image, reports_dir: Path, platform: str | None = None, release: str | None = None
) -> str | None:
    """Why image may not be pushed for target name on platform, or None when its smoke report
    (reports/smoke-<target>[-v<release>][-<arch>].json) clears it."""
    path = Path(reports_dir) / f"smoke-{reports.key(name, platform, release)}.json"
    release_option = f" --vllm {release}" if release else ""
    run = f"run `python build.py smoke {name}{platforms.parse(platform).option}{release_option}` first"
    try:
        report = json.loads(path.read_text())
    except OSError:
        return f"no smoke report for {name} ({path}); {run}"
    except ValueError:
        return f"{path} is not valid JSON; {run}"
    if report.get("target") != name:
        return f"{path} is for target {report.get('target')!r}, not {name}; {run}"
    if not report.get("ok"):
        failed = [c["name"] for c in report.get("checks", []) if c.get("status") == "fail"]
        return f"the smoke test of {report.get('image')} failed ({', '.join(failed) or 'no checks'}; {path})"
    # The report names the image it tested; it clears this image only if that is the same image id.
    tested = report.get("image_id") or getattr(local_image(client, report.get("image") or ""), "id", None)
    if tested != image.id:
        return (
            f"{path} tested {report.get('image')} ({(tested or 'no longer here')[:19]}), not this image "
            f"({image.id[:19]}); {run} on the image you push"
        )
    # An image rebuilt under the same tag after its smoke test has the tag but not the test.
    built = image.attrs.get("Created", "")[:19]
    written = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(path.stat().st_mtime))
    if not report.get("image_id") and built > written:
        return f"the image was built ({built}Z) after its smoke report ({written}Z); {run} again"
    return None


# -- the registry ------------------------------------------------------------------------------


def check_registry(host: str) -> None:
    try:
        registry_api.check(host)
    except registry_api.RegistryUnavailable as e:
        raise RegistryUnavailable(f"cannot push to {e}") from None


def remote_digest(host: str, name: str, tag: str) -> str | None:
    """The digest the registry holds for name:tag, or None when it holds none or will not say
    (a registry that wants a login: then the push itself decides)."""
    try:
        return registry_api.manifest_digest(host, name, tag)
    except registry_api.RegistryUnavailable as e:
        raise RegistryUnavailable(f"cannot push to {e}") from None
    except registry_api.RegistryError:
        return None


# -- pushing -------------------------------------------------------------------------------------


def _push_stream(client, repo: str, tag: str) -> str:
    """docker push; errors come inside the stream, not as exceptions. Returns the pushed digest."""
    digest = None
    for chunk in client.api.push(repo, tag=tag, stream=True, decode=True):
        if "error" in chunk:
            message = ANSI.sub("", chunk["error"]).strip().splitlines()[0]
            if re.search(r"no basic auth credentials|unauthorized|authentication required|denied", message, re.I):
                host = reference.Reference.split(repo).host
                message += (
                    f": the registry wants a login; run `docker login {host}` (build.py sends what "
                    f"that stored in {registry_api.docker_config_path()}, or in the credsStore it names)"
                )
            raise PushError(f"pushing {repo}:{tag} failed: {message}")
        digest = (chunk.get("aux") or {}).get("Digest") or digest
    if digest is None:
        raise PushError(f"pushing {repo}:{tag}: the engine reported no digest")
    return digest


@dataclass
class Part:
    """One platform's image of a release."""

    platform: str  # linux/arm64
    source: str  # the local image pushed
    image: object
    tags: list[str] = field(default_factory=list)


@dataclass
class Release:
    """What one target's push puts in the registry: one image under the target's tags, or (two or
    more platforms) each platform's image under its own -<arch> tags and an index under the
    target's tags."""

    name: str
    revision: str  # the full commit every part was built from
    parts: list[Part]
    tags: list[str] = field(default_factory=list)  # the index's; empty for one platform
    report_release: str | None = None  # Matrix.report_release: where its reports are filed

    @property
    def multi(self) -> bool:
        return len(self.parts) > 1


def chosen_parts(client, matrix: Matrix, name: str, wanted: list[str] | None, sources: dict, log) -> list[Part]:
    """The platforms of name to push, each with its local image. wanted: exactly those (each must
    be one of the target's and built); else every platform sources names for the target (keyed
    like the reports: xeon6, xeon6-arm64), else every one of the target's with a local image, the
    others named in the log."""
    if wanted:
        chosen = list(dict.fromkeys(matrix.platform(name, p).name for p in wanted))  # MatrixError: one line
    elif any(reports.key(name, p, matrix.report_release) in sources for p in matrix.platforms(name)):
        chosen = [p for p in matrix.platforms(name) if reports.key(name, p, matrix.report_release) in sources]
    else:
        chosen = [p for p in matrix.platforms(name) if local_image(client, matrix.tag(name, p)) is not None]
        for p in matrix.platforms(name):
            if p not in chosen:
                log(
                    f"{name}: no local image {matrix.tag(name, p)}, so {p} is not in this push "
                    f"(build it with `python build.py build {name}{platforms.parse(p).option}`)"
                )
        chosen = chosen or [platforms.DEFAULT]
    parts = []
    for p in chosen:
        source = sources.get(reports.key(name, p, matrix.report_release)) or matrix.tag(name, p)
        image = local_image(client, source)
        if image is None:
            on = platforms.parse(p).option
            raise PushError(f"no local image {source}; build it first (`python build.py build {name}{on}`)")
        wrong = wrong_platform(image, source, p)
        if wrong:
            raise PushError(wrong)
        parts.append(Part(p, source, image))
    return parts


def plan_release(matrix: Matrix, name: str, parts: list[Part], moving_tag: bool, allow_dirty: bool) -> Release:
    """Tag the parts (one platform: the target's tags with the platform's local tag suffix; more:
    -<arch> tags, the target's tags going to the index). Every part must come from one commit."""
    revisions = {part.source: short_revision(part.image, allow_dirty) for part in parts}
    if len(set(revisions.values())) > 1:
        built = ", ".join(f"{source} from {rev}" for source, rev in revisions.items())
        raise PushError(
            f"{name}: one index must hold images of one commit, but {built}; rebuild them from the same commit"
        )
    short = next(iter(revisions.values()))
    full = (parts[0].image.labels or {}).get("org.opencontainers.image.revision") or facts.revision()
    if len(parts) == 1:
        suffix = platforms.parse(parts[0].platform).tag_suffix
        parts[0].tags = tags_for(matrix, name, short, moving_tag, suffix)
        return Release(name, full, parts, report_release=matrix.report_release)
    for part in parts:
        part.tags = tags_for(matrix, name, short, False, f"-{platforms.parse(part.platform).architecture}")
    return Release(name, full, parts, tags_for(matrix, name, short, moving_tag), matrix.report_release)


def push(
    client,
    matrix: Matrix,
    targets: list[str],
    registry: str,
    *,
    platforms_wanted: list[str] | None = None,
    moving_tag: bool = False,
    skip_smoke: bool = False,
    allow_dirty: bool = False,
    sources: dict[str, str] | None = None,
    reports_dir: Path | None = None,
    cosign_key: Path | None = None,
    cosign_password_file: Path | None = None,
    log=print,
) -> list[dict]:
    """Tag and push each target's image, for each of its platforms (chosen_parts), joined by an
    index when there are two or more; returns (and records in reports_dir/pushed.json, default
    reports.folder()) one entry
    per target: target, repository, tags, digest, image id, which tags were pushed or already
    there; an index's entry holds one such entry per platform under "platforms". sources maps a
    target's report key (xeon6, xeon6-arm64) to the local image to push (default: its tag). With
    cosign_key, cosign signs every manifest pushed and attests the reports to each image (entry
    "cosign"); without, nothing is signed or attested."""
    repo = repository(matrix, registry)
    reports_dir = Path(reports_dir or reports.folder())
    cosigner = _cosigner(cosign_key, cosign_password_file)
    plan = []
    # Every gate is checked before anything is pushed, so a refusal never leaves half a release.
    for name in targets:
        parts = chosen_parts(client, matrix, name, platforms_wanted, sources or {}, log)
        # What the images are (one commit) first: the report gates depend on when each was built.
        plan.append(plan_release(matrix, name, parts, moving_tag, allow_dirty))
        for part in parts:
            refusal = smoke_refusal(client, name, part.image, reports_dir, part.platform, matrix.report_release)
            if refusal and not skip_smoke:
                raise PushError(f"refusing to push {part.source}: {refusal} (or pass --skip-smoke)")
            if refusal:
                log(f"WARNING: pushing {part.source} WITHOUT a passing smoke test (--skip-smoke): {refusal}")
            for _, path in cosign.reports_of(reports.key(name, part.platform, matrix.report_release), reports_dir):
                if path.is_file() and _older_than(path, part.image):
                    raise PushError(
                        f"refusing to push {part.source}: {path} was written before the image was built; "
                        f"regenerate it for this image (or remove it to push without it)"
                    )
    check_registry(reference.Reference.split(repo).host)
    if cosigner:  # what podman and CRI-O nodes check the signatures with (docs/publish.md); before any push
        try:
            pem = cosign.public_key(*cosigner)
            written = sigstore_policy.write(reports_dir / "containers", repo, pem, str(cosigner[0]))
        except (sigstore_policy.PolicyError, cosign.CosignError) as e:
            raise PushError(f"cannot write the node policy for {repo}: {e}") from None
        log(f"wrote {', '.join(str(p) for p in written)}")
    steps = [functools.partial(_push_release, client, release, repo, reports_dir, cosigner, log) for release in plan]
    return run_steps(client, steps, repo, reports_dir)


def _cosigner(key: Path | None, password_file: Path | None):
    """(key, password file) for cosign, checked before anything is pushed; None without a key."""
    if key is None:
        return None
    if not Path(key).is_file():
        raise PushError(f"--cosign-key {key}: no such file (`cosign generate-key-pair` writes cosign.key)")
    password = Path(password_file) if password_file else None
    try:
        cosign.check_key(Path(key), password)
    except cosign.CosignError as e:
        raise PushError(str(e)) from None
    return Path(key), password


def _push_release(client, release: Release, repo: str, reports_dir: Path, cosigner, log, created: list[str]) -> dict:
    """Push each part, then, for several, the index under the target's tags; with cosign, each
    part and the index signed and each part's reports attested to it."""
    entries = []
    for part in release.parts:
        entry = _push_target(client, release.name, part.source, part.image, repo, part.tags, log, created)
        entry["platform"] = part.platform
        key = reports.key(release.name, part.platform, release.report_release)
        _sign_and_attest(entry, key, reports_dir, cosigner, log)
        entries.append(entry)
    if not release.multi:
        return entries[0]
    pushed = reference.Reference.split(repo)
    host, path = pushed.host, pushed.repository
    descriptors = [index.descriptor(host, path, e["digest"], e["platform"]) for e in entries]
    data = index.body(descriptors, release.revision)
    digest = registry_api.sha256_digest(data)
    entry = {
        "target": release.name,
        "repository": repo,
        "tags": release.tags,
        "digest": digest,
        "media_type": index.OCI_INDEX,
        "pushed": [],
        "already_present": [],
        "platforms": entries,
    }
    for tag in release.tags:
        if remote_digest(host, path, tag) == digest:
            entry["already_present"].append(tag)
            log(f"{repo}:{tag} is already the index {digest}; not stored again")
            continue
        index.put(host, path, tag, data)
        entry["pushed"].append(tag)
        log(f"stored the index of {', '.join(e['platform'] for e in entries)} as {repo}:{tag} {digest}")
    if cosigner:
        entry["cosign"] = {"signed": cosign.sign(host, path, digest, *cosigner), "attestations": []}
        log(f"signed {entry['cosign']['signed']} with cosign ({cosigner[0]})")
    return entry


def _forget_created(client, created: list[str], results: list[dict], repo: str) -> None:
    """A push that fails leaves no registry tag behind on this machine that it made itself, except
    those of what did reach the registry."""
    done = {f"{repo}:{t}" for r in results for e in [r, *r.get("platforms", [])] for t in e["tags"]}
    for ref in created:
        if ref not in done:
            client.images.remove(ref, noprune=True)


def push_plan(client, plan, repo: str, log, reports_dir: Path | None = None) -> list[dict]:
    """Push each (name, source, image, tags) of plan to repo (run_steps)."""
    steps = [functools.partial(_push_target, client, *item[:3], repo, item[3], log) for item in plan]
    return run_steps(client, steps, repo, Path(reports_dir or reports.folder()))


def run_steps(client, steps, repo: str, reports_dir: Path) -> list[dict]:
    """Run each step (given the list it adds the local registry tags it makes to; returns the
    entry of what reached the registry); record every entry in pushed.json, and on a failure
    remove the local registry tags made for what did not get there."""
    results, created = [], []
    read_pushed(reports_dir / PUSHED_FILE)  # a record push could not add to refuses it before anything is pushed
    try:
        for step in steps:
            results.append(step(created))
    except (PushError, registry_api.RegistryError, cosign.CosignError) as e:
        _forget_created(client, created, results, repo)
        raise e if isinstance(e, PushError) else PushError(str(e)) from None
    finally:
        # Whatever did reach the registry is recorded, even when a later target fails.
        if results:
            record(results, reports_dir / PUSHED_FILE)
    return results


def _push_target(client, name, source, image, repo, tags, log, created: list[str]) -> dict:
    # repo names its host (split_registry refuses a registry without one): no Docker Hub default
    # applies, host and path are what it was composed of.
    pushing = reference.Reference.split(repo)
    host, path = pushing.host, pushing.repository
    entry = {
        "target": name,
        "image": source,
        "image_id": image.id,
        "repository": repo,
        "tags": tags,
        "digest": None,
        "pushed": [],
        "already_present": [],
    }
    for tag in tags:
        if f"{repo}:{tag}" not in (client.images.get(image.id).tags or []):
            created.append(f"{repo}:{tag}")
        image.tag(repo, tag)
        repo_digests = client.images.get(image.id).attrs.get("RepoDigests") or []
        ours, theirs = reference.recorded_digest(repo_digests, repo), remote_digest(host, path, tag)
        if ours and ours == theirs:
            log(f"{repo}:{tag} is already in the registry at {theirs}; not pushed")
            entry["already_present"].append(tag)
            entry["digest"] = theirs
            continue
        start = time.monotonic()
        entry["digest"] = _push_stream(client, repo, tag)
        entry["pushed"].append(tag)
        log(f"pushed {repo}:{tag} {entry['digest']} ({time.monotonic() - start:.1f}s)")
    return entry


def _older_than(path: Path, image) -> bool:
    built = image.attrs.get("Created", "")[:19]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(path.stat().st_mtime)) < built


def _sign_and_attest(entry: dict, key: str, reports_dir: Path, cosigner, log) -> None:
    """cosign signs the entry's pushed digest and attests each report filed under key to it (the
    SBOM as cyclonedx, the provenance as slsaprovenance1), recorded in entry["cosign"]; without a
    key, the log says nothing was."""
    if cosigner is None:
        log(f"{entry['repository']}@{entry['digest']}: not signed or attested (no --cosign-key)")
        return
    pushed = reference.Reference.split(entry["repository"])
    host, path = pushed.host, pushed.repository
    signed = cosign.sign(host, path, entry["digest"], *cosigner)
    entry["cosign"] = {"signed": signed, "attestations": []}
    log(f"signed {signed} with cosign ({cosigner[0]})")
    for attestation, document in cosign.reports_of(key, reports_dir):
        if not document.is_file():
            log(f"no {document} for {key}: nothing attested")
            continue
        done = cosign.attest(host, path, entry["digest"], attestation, document, *cosigner)
        entry["cosign"]["attestations"].append(done)
        log(f"attested {document} to {signed} ({done['type']})")


def read_pushed(path: Path) -> list[dict]:
    """pushed.json's entries, [] before the first push; a file that is not what push writes is one
    line naming it (never taken for empty: record would write over it)."""
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PushError(f"{path} is not JSON ({e}): {PUSHED_FIX}") from None
    bad = _not_a_push_record(entries)
    if bad:
        raise PushError(f"{path}: {bad}: {PUSHED_FIX}")
    return entries


PUSHED_FIX = "correct it, or move it aside and push again (push writes it anew)"


def _not_a_push_record(entries) -> str | None:
    """What the entries lack of what record, pushed_entry and pushed_platforms read, or None."""
    if not isinstance(entries, list):
        return "not a list of push records"
    for n, e in enumerate(entries, 1):
        parts = e.get("platforms", []) if isinstance(e, dict) else None
        if not (
            isinstance(e, dict)
            and all(isinstance(e.get(key), str) for key in ("target", "repository"))
            and isinstance(e.get("digest"), (str, type(None)))
            and isinstance(e.get("platform"), (str, type(None)))
            and isinstance(parts, list)
            and all(isinstance(p, dict) and isinstance(p.get("platform"), str) for p in parts)
        ):
            return (
                f"entry {n} is not a push record (target and repository strings, a digest string, platforms "
                "each with a platform string)"
            )
    return None


def record(entries: list[dict], path: Path) -> None:
    """Merge into pushed.json: one entry per (target, repository), the latest push winning."""
    fresh = {(e["target"], e["repository"]) for e in entries}
    kept = [e for e in read_pushed(path) if (e["target"], e["repository"]) not in fresh]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept + entries, indent=2) + "\n")


def pushed_entry(target: str, reports_dir: Path | None = None, repo: str | None = None) -> dict | None:
    """The pushed.json entry of the target's last recorded push (to repo when given), or None;
    reports_dir: default reports.folder()."""
    for e in reversed(read_pushed(Path(reports_dir or reports.folder()) / PUSHED_FILE)):
        if e["target"] == target and e.get("digest") and repo in (None, e["repository"]):
            return e
    return None


def pushed_ref(target: str, reports_dir: Path | None = None, repo: str | None = None) -> str | None:
    """repository@digest of the target's last recorded push (to repo when given), or None."""
    e = pushed_entry(target, reports_dir, repo)
    return entry_ref(e) if e else None


def entry_ref(entry: dict) -> str:
    """repository@digest of a pushed.json entry."""
    return f"{entry['repository']}@{entry['digest']}"


def pushed_platforms(entry: dict) -> list[str]:
    """The platforms a pushed.json entry's digest holds: an index's entries, else its one image's
    (entries written before platforms were recorded are linux/amd64's: nothing else was pushed)."""
    return [p["platform"] for p in entry.get("platforms", [])] or [entry.get("platform") or platforms.DEFAULT]
