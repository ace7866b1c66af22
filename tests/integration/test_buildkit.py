"""The BuildKit path the CPU stand-in base is built with (docker_build.build_with_buildkit): real
builds through the docker CLI on the engine under test, FROM the local root filesystem."""

import pytest
from docker.errors import ImageNotFound

from gemma4_images.build.docker_build import BuildFailed, BuildSpec, build_with_buildkit

pytestmark = pytest.mark.integration

DOCKERFILE = """\
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
ARG WORD
RUN echo "said ${WORD}" > /said
LABEL io.gemma4-images.test=buildkit
"""
FAILING = DOCKERFILE + 'RUN echo "the detail before the failure"; exit 3\n'


def spec(tmp_path, dockerfile, tag, rootfs):
    (tmp_path / "Dockerfile").write_text(dockerfile)
    return BuildSpec(
        dockerfile="Dockerfile", tag=tag, context=tmp_path, buildargs={"ROOTFS_IMAGE": rootfs, "WORD": "hello"}
    )


def test_a_buildkit_build_tags_the_image_it_reports(client, rootfs, tmp_path):
    lines = []
    tag = "gemma4-e2b-test/buildkit:ok"
    image_id = build_with_buildkit(client, spec(tmp_path, DOCKERFILE, tag, rootfs), lines.append)
    assert client.images.get(tag).id == image_id
    said = client.containers.run(image_id, ["cat", "/said"], remove=True, network_mode="host")
    assert said == b"said hello\n"  # the build arg reached the RUN step
    assert any(line.startswith("  Step ") and 'RUN echo "said' in line for line in lines), lines


def test_a_failed_buildkit_build_names_its_step_and_leaves_nothing(
    client, rootfs, tmp_path, untagged, no_build_leftovers
):
    tag = untagged("gemma4-e2b-test/buildkit:failed")
    with pytest.raises(BuildFailed) as failed:
        build_with_buildkit(client, spec(tmp_path, FAILING, tag, rootfs), print)
    assert "exit code: 3" in failed.value.error
    assert "the detail before the failure" in failed.value.step
    assert "the detail before the failure" in failed.value.tail
    with pytest.raises(ImageNotFound):
        client.images.get(tag)
