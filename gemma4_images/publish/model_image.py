"""Model images: a model's files alone in an OCI image, at /models/<name>, so that a cluster pulls
the model like any image (cached per node, by digest, no hub at run time) and mounts it read-only
as a Kubernetes `image` volume (KEP-4639). The image has one layer and no shell, command or
base: nothing in it runs. Tagged by the model's revision: the hub's commit for a hub id, a content
hash for a local folder, so the same files always get the same tag.

Pushing reuses publish.py (registry check, push stream, pushed.json); nothing here talks to a
registry itself."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from docker.errors import APIError, NotFound

from gemma4_images.build import owned
from gemma4_images.build.docker_build import local_image
from gemma4_images.publish import publish
from gemma4_images.spec.matrix import MODELS_ROOT, model_path
from gemma4_images.spec.reference import Reference
from gemma4_images.spec.upstream import stream_sha256

DEFAULT_REPOSITORY = "gemma4-e2b-models"  # local images: gemma4-e2b-models/<name>:<tag>
REGISTRY_PATH = "models"  # pushed images: <registry>/models/<name>:<tag>
SHORT = 12
LABELS = {
    "name": "io.gemma4-images.model.name",
    "path": "io.gemma4-images.model.path",
    "source": "io.gemma4-images.model.source",
    "revision": "org.opencontainers.image.revision",
    "title": "org.opencontainers.image.title",
}
# A registry path component (github.com/distribution/reference): also a safe folder name.
NAME = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelImageError(Exception):
    """A model image that cannot be made or pushed; the message is one line with the fix."""


@dataclass
class ModelImage:
    ref: str  # the local image reference
    name: str
    revision: str  # full: the hub commit, or content-sha256:<hex>
    tag: str
    image_id: str
    built: bool  # False: an image of the same name and revision was already here

    @property
    def path(self) -> str:
        return model_path(self.name)


def check_name(name: str, option: str = "--name") -> str:
    """name when it can be the model's folder under /models (a pod's subPath too: no `..`, no `/`)
    and an image name, else one line naming option."""
    if not NAME.fullmatch(name or ""):
        raise ModelImageError(
            f"{option} {name!r} is not usable as a folder and image name: use lowercase letters, digits "
            "and the separators . _ - (e.g. gemma-4-e2b-it)"
        )
    return name


def default_name(source: str) -> str:
    """The hub repository's last part, for a hub id or a folder of the hub client's cache (then
    followed by the path inside the snapshot, for a model in a subfolder of one), else the folder's
    last part; in the characters an image name allows."""
    snapshot = hub_snapshot_of(Path(source)) if Path(source).exists() else None
    if snapshot:
        last = "-".join([snapshot[1].split("/")[-1], *snapshot[2].parts])
    else:
        last = Path(source.rstrip("/")).name if not HUB_ID.fullmatch(source) else source.split("/")[-1]
    name = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")
    if not name:
        raise ModelImageError(f"cannot make an image name from {source!r}; pass --name")
    return name


def tag_for(revision: str) -> str:
    """The image tag for a revision: the commit's first 12 hex digits, or content-<12 hex>."""
    if revision.startswith("content-sha256:"):
        return "content-" + revision.removeprefix("content-sha256:")[:SHORT]
    return revision[:SHORT]


# -- the files ---------------------------------------------------------------------------------


# The hub client's cache folder of a model repository: models--ORG--NAME (huggingface_hub's
# repo_folder_name; a repository id holds no "--", validate_repo_id refuses it, so the name splits back).
HUB_CACHE_PREFIX, HUB_CACHE_SEP = "models--", "--"


def hub_snapshot_of(folder: Path) -> tuple[Path, str, Path] | None:
    """For a folder in a snapshot of the hub client's cache (.../models--ORG--NAME/snapshots/
    <commit>, or a subfolder of it): (that repository's cache folder, ORG/NAME, the folder's path
    inside the snapshot); else None."""
    real = Path(os.path.realpath(folder))
    for snapshot in [real, *real.parents]:
        repo = snapshot.parent.parent
        if snapshot.parent.name == "snapshots" and repo.name.startswith(HUB_CACHE_PREFIX) and (repo / "blobs").is_dir():
            repo_id = repo.name.removeprefix(HUB_CACHE_PREFIX).replace(HUB_CACHE_SEP, "/")
            return repo, repo_id, real.relative_to(snapshot)
    return None


def link_root(folder: Path) -> Path:
    """Where links inside folder may point: the folder itself, or, for a snapshot of the hub
    client's cache or a subfolder of one (whose files are links into the repository's blobs/),
    that repository's cache folder."""
    snapshot = hub_snapshot_of(folder)
    return snapshot[0] if snapshot else Path(os.path.realpath(folder))


MAX_HOPS = 40  # the kernel's own limit on links in one lookup (path_resolution(7))


def _shown(path) -> str:
    """A path for a one-line message: a newline or other control character in a name is escaped."""
    return repr(str(path))[1:-1]


def _followed(link: Path, parent: Path, shown: Path, root: Path) -> Path:
    """The real path of the link named link.name in the real folder parent, followed one hop at a
    time, or one line naming it: a loop, a dangling link, a hop through a link that lies outside
    root (whoever can change that link decides what gets packed), or an end outside root."""
    current, pending, hops = parent, [link.name], 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        step = current.parent if name == ".." else current / name
        if not step.is_symlink():
            if not step.exists():
                raise ModelImageError(
                    f"{_shown(shown)} is a symlink to {_shown(os.readlink(link))}, which does not exist "
                    f"({_shown(step)} is missing); remove the link or restore its target"
                )
            current = step
            continue
        hops += 1
        if hops > MAX_HOPS:
            raise ModelImageError(f"{_shown(shown)} is a symlink loop; remove the link")
        if hops > 1 and not step.is_relative_to(root):
            raise ModelImageError(
                f"{_shown(shown)} leads through {_shown(step)}, a symlink outside {_shown(root)}: only "
                "files inside it are packed; copy the file in or remove the link"
            )
        target = os.readlink(step)
        pending[:0] = Path(target).parts
        if os.path.isabs(target):
            current, pending = Path("/"), pending[1:]
    if not current.is_relative_to(root):
        raise ModelImageError(
            f"{_shown(shown)} is a symlink to {_shown(current)}, outside {_shown(root)}: only files inside "
            "it are packed; copy the file in or remove the link"
        )
    return current


def open_packed(folder: Path, rel: Path, root: Path):
    """folder/rel opened for reading and checked again on the open file: a regular file inside
    root, folder's link_root (the folder can change between the listing and the read, and a pipe put there
    must not hang the build: O_NONBLOCK)."""
    path = folder / rel
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ModelImageError(
            f"{_shown(path)} cannot be read ({e.strerror}); fix its permissions or remove it"
        ) from None
    f = os.fdopen(fd, "rb")
    real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    if not stat.S_ISREG(os.fstat(fd).st_mode) or not real.is_relative_to(root):
        f.close()
        raise ModelImageError(f"{_shown(path)} changed while it was packed (it is now {_shown(real)}); run it again")
    return f


def model_files(folder: Path) -> list[Path]:
    """Every file of the model, relative to folder, sorted; hidden entries (.git, .cache — the
    hub client's own download records) are not the model. Links are followed only where they stay
    inside link_root (the hub cache's snapshot files are links into its blob store); a link out,
    a loop, a dangling link or anything but a regular file is refused, naming it."""
    root, files = link_root(folder), []

    def walk(rel: Path, chain: tuple[Path, ...]) -> None:  # chain: the real folders down to rel
        try:
            with os.scandir(folder / rel) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        except PermissionError:
            raise ModelImageError(
                f"{_shown(folder / rel)} cannot be read (permission denied); fix its permissions"
            ) from None
        for e in entries:
            path, shown = Path(e.path), folder / rel / e.name
            real = _followed(path, chain[-1], shown, root) if e.is_symlink() else chain[-1] / e.name
            if real.is_dir():
                if real in chain:
                    raise ModelImageError(
                        f"{_shown(shown)} is a symlink to {_shown(real)}, a folder that holds it (a loop); "
                        "remove the link"
                    )
                walk(rel / e.name, (*chain, real))
            elif real.is_file():
                files.append(rel / e.name)
            else:
                raise ModelImageError(f"{_shown(shown)} is not a regular file (a socket, pipe or device); remove it")

    walk(Path(), (Path(os.path.realpath(folder)),))
    return sorted(files, key=lambda p: p.as_posix())


def check_folder(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ModelImageError(f"{folder} is not a folder; give a model folder or a hub id (OWNER/NAME)")
    files = model_files(folder)
    if Path("config.json") not in files:
        raise ModelImageError(
            f"{folder} has no config.json, so it is not a model folder vLLM can load; give the folder "
            "that holds config.json, the weights and the tokenizer"
        )
    return files


def content_revision(folder: Path, files: list[Path]) -> str:
    """content-sha256:<hex> of the file list: each relative path and its bytes' sha256, so a
    renamed, added, removed or changed file changes it, and mtimes or modes do not."""

    root = link_root(folder)

    def sha256(p: Path) -> str:
        with open_packed(folder, p, root) as f:
            return stream_sha256(f)

    listing = "".join(f"{p.as_posix()}\0{sha256(p)}\n" for p in files)
    return "content-sha256:" + hashlib.sha256(listing.encode()).hexdigest()


CHUNK = 1 << 20


def streamed_layer(folder: Path, files: list[Path], name: str):
    """write_layer's bytes, yielded as a thread writes them into a pipe: a 10 GB layer goes to the
    engine without a temporary copy on disk or in memory. The writer's error is raised at the end."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out:
                write_layer(out, folder, files, name)
        except BaseException as e:  # noqa: BLE001 - handed to the reader, which raises it
            failed.append(e)

    thread = threading.Thread(target=writer, name="model-layer", daemon=True)
    thread.start()
    with os.fdopen(read_fd, "rb") as layer:  # closed early (the engine stopped reading): the writer ends
        while chunk := layer.read(CHUNK):
            yield chunk
    thread.join()
    if failed:
        raise failed[0]


def write_layer(out, folder: Path, files: list[Path], name: str) -> None:
    """The image's one layer: models/<name>/... owned by root, readable by any uid (the CPU tier
    serves as uid 2000; an image volume keeps the modes it finds), with no mtimes, in a fixed
    order, so the same files give the same layer digest."""

    def entry(path: str, mode: int, size: int = 0, kind=tarfile.REGTYPE) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    root = MODELS_ROOT.strip("/")
    # "w|": a stream (no seek or tell, so a pipe does); the same bytes as "w" (compared).
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        dirs = {root, f"{root}/{name}"} | {
            f"{root}/{name}/{d.as_posix()}" for p in files for d in p.parents if str(d) != "."
        }
        for d in sorted(dirs):
            tar.addfile(entry(d, 0o755, kind=tarfile.DIRTYPE))
        inside = link_root(folder)
        for p in files:
            with open_packed(folder, p, inside) as f:
                tar.addfile(entry(f"{root}/{name}/{p.as_posix()}", 0o644, os.fstat(f.fileno()).st_size), f)


# -- the hub -------------------------------------------------------------------------------------


def hub_snapshot(repo_id: str, revision: str | None, log) -> tuple[Path, str]:
    """(folder, commit) of repo_id at revision, downloaded into the hub client's own cache.
    The token is the one huggingface_hub reads from HF_TOKEN itself: it is never passed, stored
    or written here, and is scrubbed from any error message."""
    try:
        from huggingface_hub import HfApi, constants, snapshot_download
    except ImportError:
        raise ModelImageError(
            "a hub id needs the huggingface_hub package on this host (pip install huggingface_hub), "
            "or give a local model folder"
        ) from None
    log(f"resolving {repo_id}@{revision or 'main'} on {constants.ENDPOINT}")
    try:
        commit = HfApi().model_info(repo_id, revision=revision).sha
        folder = snapshot_download(repo_id, revision=commit)
    except Exception as e:  # the hub client raises many kinds; each becomes the one line below
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
        if token:
            reason = reason.replace(token, "<HF_TOKEN>")
        raise ModelImageError(
            f"cannot download {repo_id}@{revision or 'main'} from {constants.ENDPOINT}: {reason[:300]} "
            "(is the hub reachable, and HF_TOKEN set for a gated model?)"
        ) from None
    return Path(folder), commit


# -- build ---------------------------------------------------------------------------------------


def build(
    client,
    source: str,
    *,
    name: str | None = None,
    revision: str | None = None,
    tag: str | None = None,
    log=print,
) -> ModelImage:
    """The model image of source (a local folder, or a hub id downloaded with HF_TOKEN from the
    environment). An image of the same name and revision already here is reused, not rebuilt."""
    name = check_name(name) if name else default_name(source)
    if Path(source).exists():
        if revision:
            raise ModelImageError(
                f"--revision is for a hub id; {source} is a local folder, whose revision is its content hash"
            )
        folder, files = Path(source), check_folder(Path(source))
        revision, origin = content_revision(folder, files), "local folder"
    elif HUB_ID.fullmatch(source) and not source.startswith("."):
        folder, revision = hub_snapshot(source, revision, log)
        files, origin = check_folder(folder), f"https://huggingface.co/{source}"
    else:
        raise ModelImageError(f"{source!r} is neither a folder here nor a hub id (OWNER/NAME)")
    ref = tag or f"{DEFAULT_REPOSITORY}/{name}:{tag_for(revision)}"
    labels = {
        LABELS["name"]: name,
        LABELS["path"]: model_path(name),
        LABELS["source"]: origin,
        LABELS["revision"]: revision,
        LABELS["title"]: f"{name} model files (no runtime)",
    }
    existing = local_image(client, ref)
    if existing is not None and all((existing.labels or {}).get(k) == v for k, v in labels.items()):
        log(f"{ref} already holds {name} at {revision}; not rebuilt")
        return ModelImage(ref, name, revision, tag_for(revision), existing.id, built=False)
    tagged = Reference.split(ref)
    if tagged.digest:  # the engine's import takes a repository and a tag; a digest comes from a push
        raise ModelImageError(f"--tag {ref} names a digest: an image built here is tagged NAME[:TAG]")
    log(f"packing {len(files)} files of {folder} into {ref} at {model_path(name)}")
    # `docker import`: one layer from our tar and the labels; no Dockerfile step can record
    # anything from this host's environment in the image's history. A generator: sent chunked.
    changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in labels.items()]
    try:
        answer = client.api.import_image_from_data(
            streamed_layer(folder, files, name), repository=tagged.name, tag=tagged.tag_or_latest, changes=changes
        )
    except APIError as e:
        raise ModelImageError(f"the Docker engine refused to import {ref}: {e.explanation or e}") from None
    status = [json.loads(line) for line in answer.splitlines() if line.strip()]
    if not status or "error" in status[-1]:
        raise ModelImageError(f"importing {ref} failed: {status[-1].get('error') if status else 'no answer'}")
    image = client.images.get(ref)
    return ModelImage(ref, name, revision, tag_for(revision), image.id, built=True)


# -- push ----------------------------------------------------------------------------------------


def push(client, ref: str, registry: str, log=print, reports_dir: Path | None = None, check: bool = True) -> dict:
    """Push the model image ref to <registry>/models/<name>:<revision tag>; returns its pushed.json
    entry (target model:<name>), recorded there like the serving images' pushes. check=False when
    the caller has already asked the registry (the CLI does, before the build)."""
    image = local_image(client, ref)
    labels = (image.labels or {}) if image else {}
    if LABELS["name"] not in labels:
        raise ModelImageError(f"{ref} is not a model image built by `build.py model-image`; build it first")
    name, revision = labels[LABELS["name"]], labels[LABELS["revision"]]
    repo = publish.registry_path(registry, REGISTRY_PATH, name)
    if check:
        publish.check_registry(Reference.split(repo).host)
    return publish.push_plan(client, [(f"model:{name}", ref, image, [tag_for(revision)])], repo, log, reports_dir)[0]


# -- running it ----------------------------------------------------------------------------------


def docker_volume(client, ref: str, volume: str) -> str:
    """Docker's nearest thing to an `image` volume: a named volume filled from the model image
    (the engine copies an image's files into an empty volume when a container is created on it;
    the container is never started and is removed at once). Mount it read-only at /models.
    A volume of that name is replaced: the engine fills only an empty one, so an old one would
    keep serving the files it was first filled with."""
    try:
        client.volumes.get(volume).remove()
    except NotFound:
        pass
    except APIError as e:
        raise ModelImageError(f"volume {volume} exists and cannot be replaced ({e.explanation}); remove it") from None
    client.volumes.create(volume)
    try:
        holder = client.containers.create(
            ref,
            command=["none"],
            volumes={volume: {"bind": MODELS_ROOT, "mode": "ro"}},
            network_disabled=True,
            labels=owned.labels(),
        )
        holder.remove()
    except (APIError, NotFound) as e:
        client.volumes.get(volume).remove(force=True)
        raise ModelImageError(f"cannot fill volume {volume} from {ref}: {e}") from None
    return volume
