"""Model images without an engine: the revision of a local folder, the layer's layout and modes,
names, and the pod pieces that mount the image, validated against the Kubernetes API schema."""

import hashlib
import io
import os
import tarfile

import kubernetes_validate
import pytest
import yaml

from gemma4_images.generate import k8s
from gemma4_images.publish import model_image
from gemma4_images.spec import matrix

M = matrix.load()
# Image volumes exist in the API from 1.31 (alpha); subPath into them works from 1.33 (beta).
VERSIONS = ["1.33.0", kubernetes_validate.latest_version()]
REF = "127.0.0.1:5000/models/tiny-gemma4-trained@sha256:" + "b" * 64


def folder(tmp_path, files):
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path


def revision(path):
    return model_image.content_revision(path, model_image.check_folder(path))


def test_content_revision_follows_names_and_bytes_not_times_or_modes(tmp_path):
    base = folder(tmp_path / "a", {"config.json": b"{}", "model.safetensors": b"w" * 10})
    first = revision(base)
    assert first.startswith("content-sha256:") and revision(base) == first
    (base / "model.safetensors").chmod(0o600)
    (base / "config.json").touch()
    assert revision(base) == first
    (base / "model.safetensors").write_bytes(b"w" * 9 + b"x")
    assert revision(base) != first
    moved = folder(tmp_path / "b", {"config.json": b"{}", "weights.safetensors": b"w" * 10})
    assert revision(moved) != first


def test_hidden_entries_are_not_the_model(tmp_path):
    base = folder(tmp_path, {"config.json": b"{}", ".cache/huggingface/x.lock": b"", ".gitattributes": b"*"})
    assert [p.as_posix() for p in model_image.model_files(base)] == ["config.json"]


def refusal(folder_path) -> str:
    """The one line check_folder refuses folder_path with (before anything is built)."""
    with pytest.raises(model_image.ModelImageError) as e:
        model_image.check_folder(folder_path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_link_to_a_file_outside_the_folder_is_refused_naming_it(tmp_path):
    (tmp_path / "secret").write_bytes(b"host secret")
    base = folder(tmp_path / "model", {"config.json": b"{}"})
    (base / "notes.txt").symlink_to("../secret")
    line = refusal(base)
    assert f"{base}/notes.txt is a symlink to {tmp_path}/secret, outside {base}" in line
    assert "remove the link" in line


def test_a_link_to_a_folder_outside_is_refused_naming_it(tmp_path):
    folder(tmp_path / "elsewhere", {"id_rsa": b"key"})
    base = folder(tmp_path / "model", {"config.json": b"{}", "sub/tokenizer.json": b"t"})
    (base / "sub" / "more").symlink_to(tmp_path / "elsewhere")
    assert refusal(base).startswith(f"{base}/sub/more is a symlink to {tmp_path}/elsewhere, outside {base}")


def test_a_link_that_leads_out_through_a_link_and_back_is_refused(tmp_path):
    # x -> ../hop, and hop (outside) -> model/config.json: the end is inside, but whoever can change
    # hop decides what gets packed.
    base = folder(tmp_path / "model", {"config.json": b"{}"})
    (tmp_path / "hop").symlink_to(base / "config.json")
    (base / "x").symlink_to("../hop")
    line = refusal(base)
    assert line.startswith(f"{base}/x leads through {tmp_path}/hop, a symlink outside {base}"), line


def test_a_name_with_a_newline_stays_one_line(tmp_path):
    base = folder(tmp_path / "model", {"config.json": b"{}"})
    (base / "bad\nname").symlink_to("../nowhere")
    assert "bad\\nname is a symlink to ../nowhere, which does not exist" in refusal(base)


def test_a_file_swapped_after_the_listing_is_refused_when_read(tmp_path):
    """The folder can change between check_folder and the read: the file is checked again on the
    open file. A pipe swapped in does not hang the build."""
    (tmp_path / "secret").write_bytes(b"host secret")
    base = folder(tmp_path / "model", {"config.json": b"{}", "notes.txt": b"n"})
    files = model_image.check_folder(base)
    (base / "notes.txt").unlink()
    (base / "notes.txt").symlink_to("../secret")
    with pytest.raises(model_image.ModelImageError, match=r"notes.txt changed while it was packed \(it is now "):
        model_image.write_layer(io.BytesIO(), base, files, "m")
    (base / "notes.txt").unlink()
    os.mkfifo(base / "notes.txt")
    with pytest.raises(model_image.ModelImageError, match="changed while it was packed"):
        model_image.content_revision(base, files)


def test_links_that_stay_inside_the_folder_are_followed(tmp_path):
    base = folder(tmp_path / "model", {"config.json": b"{}", "weights/a.safetensors": b"w"})
    (base / "model.safetensors").symlink_to("weights/a.safetensors")
    (base / "copy").symlink_to("weights")
    files = [p.as_posix() for p in model_image.check_folder(base)]
    assert files == ["config.json", "copy/a.safetensors", "model.safetensors", "weights/a.safetensors"]


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda d: (d / "loop").symlink_to("loop"), "loop is a symlink loop; remove the link"),
        (lambda d: (d / "a").symlink_to("b") or (d / "b").symlink_to("a"), "a is a symlink loop; remove the link"),
        (lambda d: (d / "sub" / "up").symlink_to(".."), "sub/up is a symlink to {d}, a folder that holds it (a loop)"),
        (lambda d: (d / "gone").symlink_to("nowhere"), "gone is a symlink to nowhere, which does not exist"),
        (lambda d: os.mkfifo(d / "pipe"), "pipe is not a regular file"),
    ],
    ids=["self", "pair", "parent", "dangling", "fifo"],
)
def test_loops_dangling_links_and_special_files_are_one_line_naming_the_entry(tmp_path, make, says):
    base = folder(tmp_path / "model", {"config.json": b"{}", "sub/x": b""})
    make(base)
    line = refusal(base)
    assert line.startswith(f"{base}/"), line
    assert says.format(d=base) in line, line


def test_links_across_two_folders_that_lead_back_are_a_loop(tmp_path):
    base = folder(tmp_path / "model", {"config.json": b"{}", "x/1": b"", "y/2": b""})
    (base / "x" / "to_y").symlink_to("../y")
    (base / "y" / "to_x").symlink_to("../x")
    assert "x/to_y/to_x is a symlink to" in refusal(base)


def hub_cache(tmp_path):
    """The hub client's cache layout: snapshots/<commit>/<file> are relative links to ../../blobs/<hash>."""
    repo = tmp_path / "hub" / "models--google--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / ("c" * 40)
    (snap / "sub").mkdir(parents=True)
    for name, data in {"config.json": b"{}", "sub/tokenizer.json": b"t"}.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    return repo, snap


def test_the_hub_cache_links_into_its_blobs_are_followed(tmp_path):
    _, snap = hub_cache(tmp_path)
    assert [p.as_posix() for p in model_image.check_folder(snap)] == ["config.json", "sub/tokenizer.json"]
    out = io.BytesIO()
    model_image.write_layer(out, snap, model_image.check_folder(snap), "tiny")
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        assert tar.extractfile("models/tiny/sub/tokenizer.json").read() == b"t"


def test_a_model_in_a_subfolder_of_a_hub_snapshot_is_packed(tmp_path):
    # Its files link to ../../../../blobs: inside the repository's cache, as for the snapshot itself.
    repo, snap = hub_cache(tmp_path)
    model = snap / "sub" / "model"
    model.mkdir()
    blob = next((repo / "blobs").iterdir())
    (model / "config.json").symlink_to(os.path.relpath(blob, model))
    assert [p.as_posix() for p in model_image.check_folder(model)] == ["config.json"]
    out = io.BytesIO()
    model_image.write_layer(out, model, model_image.check_folder(model), "tiny-sub-model")
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        assert tar.extractfile("models/tiny-sub-model/config.json").read() == blob.read_bytes()


def test_a_hub_snapshot_is_named_after_its_repository_not_its_commit(tmp_path):
    _, snap = hub_cache(tmp_path)  # models--google--tiny/snapshots/ccc...
    assert model_image.default_name(str(snap)) == model_image.default_name("google/tiny") == "tiny"
    assert model_image.default_name(f"{snap}/") == "tiny"
    assert model_image.default_name(str(snap / "sub")) == "tiny-sub"  # the repository's, then the path in it


def test_a_hub_snapshot_link_out_of_its_repository_cache_is_refused(tmp_path):
    repo, snap = hub_cache(tmp_path)
    (tmp_path / "hub" / "other").mkdir()
    (tmp_path / "hub" / "other" / "f").write_bytes(b"x")
    (snap / "extra").symlink_to("../../../other/f")
    assert refusal(snap).startswith(f"{snap}/extra is a symlink to {tmp_path}/hub/other/f, outside {repo}")


def test_a_refused_folder_asks_nothing_of_the_engine(tmp_path):
    (tmp_path / "secret").write_bytes(b"s")
    base = folder(tmp_path / "model", {"config.json": b"{}"})
    (base / "notes.txt").symlink_to("../secret")

    class Engine:  # a stand-in Docker client: any use of it fails the test
        def __getattr__(self, name):
            raise AssertionError(f"the engine was asked for {name}")

    with pytest.raises(model_image.ModelImageError, match="notes.txt is a symlink"):
        model_image.build(Engine(), str(base), log=lambda _: None)


def test_a_folder_without_config_is_refused_in_one_line(tmp_path):
    with pytest.raises(model_image.ModelImageError, match="no config.json"):
        model_image.check_folder(folder(tmp_path, {"weights.bin": b""}))


def test_layer_puts_the_files_at_models_name_readable_by_anyone(tmp_path):
    base = folder(tmp_path, {"config.json": b"{}", "sub/tokenizer.json": b"t"})
    (base / "config.json").chmod(0o600)
    out = io.BytesIO()
    model_image.write_layer(out, base, model_image.check_folder(base), "tiny")
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        members = {m.name: m for m in tar}
        assert tar.extractfile("models/tiny/sub/tokenizer.json").read() == b"t"
    assert sorted(members) == [
        "models",
        "models/tiny",
        "models/tiny/config.json",
        "models/tiny/sub",
        "models/tiny/sub/tokenizer.json",
    ]
    assert {m.mode for m in members.values() if m.isfile()} == {0o644}
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    again = io.BytesIO()
    model_image.write_layer(again, base, model_image.check_folder(base), "tiny")
    assert again.getvalue() == out.getvalue()  # the same files, the same layer digest


def test_the_streamed_layer_is_the_written_one_and_a_writer_error_is_raised(tmp_path, monkeypatch):
    """build() streams the layer to the engine through a pipe (no 10 GB temporary file): the same
    bytes as write_layer into a file; a file that cannot be read mid-way fails the import."""
    base = folder(tmp_path, {"config.json": b"{}", "model.safetensors": os.urandom(3 * model_image.CHUNK + 7)})
    files = model_image.check_folder(base)
    written = io.BytesIO()
    model_image.write_layer(written, base, files, "tiny")
    assert b"".join(model_image.streamed_layer(base, files, "tiny")) == written.getvalue()
    monkeypatch.setattr(model_image, "open_packed", lambda *a: open(base / "gone", "rb"))
    with pytest.raises(FileNotFoundError):
        b"".join(model_image.streamed_layer(base, files, "tiny"))


@pytest.mark.parametrize(
    "source, name",
    [("google/gemma-4-E2B-it", "gemma-4-e2b-it"), ("/data/My Model_v2/", "my-model-v2"), ("./tiny", "tiny")],
)
def test_default_names(source, name):
    assert model_image.default_name(source) == name


def test_names_an_image_cannot_carry_are_refused():
    for bad in ("Tiny", "a/b", "-x", ""):
        with pytest.raises(model_image.ModelImageError, match="--name"):
            model_image.check_name(bad)


def test_tags_are_revisions():
    assert model_image.tag_for("0123456789abcdef0123456789abcdef01234567") == "0123456789ab"
    assert model_image.tag_for("content-sha256:" + "f" * 64) == "content-ffffffffffff"


def pod_with_model_image():
    """The xeon6 Deployment with the model image mounted: an image volume at /models/<name>, the HF
    cache an emptyDir (HF_HOME stays writable under the read-only root; nothing is downloaded into
    it) and no HF_TOKEN."""
    deployment = list(
        yaml.safe_load_all(k8s.render_k8s(M, "xeon6", model_image=REF, model_name="tiny-gemma4-trained"))
    )[0]
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    pieces = {
        "volume": next(v for v in spec["volumes"] if v["name"] == k8s.MODEL_VOLUME),
        "volumeMount": next(v for v in container["volumeMounts"] if v["name"] == k8s.MODEL_VOLUME),
    }
    return deployment, container, pieces


def test_the_model_image_replaces_the_cache_claim_and_the_token():
    deployment, container, _ = pod_with_model_image()
    spec = deployment["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "emptyDir": {}} in spec["volumes"]
    assert "HF_TOKEN" not in {e["name"] for e in container["env"]}
    plain = list(yaml.safe_load_all(k8s.render_k8s(M, "xeon6")))[0]["spec"]["template"]["spec"]
    assert "persistentVolumeClaim" in next(v for v in plain["volumes"] if v["name"] == "hf-cache")
    assert "image volumes" in k8s.render_k8s(M, "xeon6", model_image=REF, model_name="x").split("apiVersion")[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pod_mounting_the_model_image_validates(version):
    deployment, _, _ = pod_with_model_image()
    kubernetes_validate.validate(deployment, version, strict=True)


def test_the_pieces_agree_with_the_image_layout():
    _, container, pieces = pod_with_model_image()
    mount, env = pieces["volumeMount"], {e["name"]: e.get("value") for e in container["env"]}
    # The image holds models/<name>/...; the mount shows that folder where GEMMA4_MODEL points.
    assert mount["readOnly"] is True and "/" + mount["subPath"] == mount["mountPath"] == env["GEMMA4_MODEL"]
    assert env["GEMMA4_MODEL"] == matrix.model_path("tiny-gemma4-trained")
    assert pieces["volume"]["image"] == {"reference": REF, "pullPolicy": "IfNotPresent"}
    assert container["args"][-2:] == ["--served-model-name", M.project.model]


def test_the_validator_rejects_an_image_volume_where_the_cluster_has_none():
    deployment, _, _ = pod_with_model_image()
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30.0", strict=True)  # no `image` volumes before 1.31
    image = deployment["spec"]["template"]["spec"]["volumes"][-1]["image"]
    image["pulPolicy"] = image.pop("pullPolicy")  # a typo a cluster would refuse
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
