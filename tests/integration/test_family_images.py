"""Build each family's real rendered Dockerfile on a stand-in base (vendor bases cannot be pulled
here: the real CPU base, reporting the expected CUDA runtime for the CUDA targets) and check what
users rely on: labels, build.json, HEALTHCHECK, the exact launch and the build's capability check."""

import shlex

import pytest
from docker.errors import ImageNotFound

from gemma4_images import facts, images, running
from gemma4_images.docker_build import BuildFailed
from gemma4_images.facts import BUILD_FACTS
from testkit import tiny_model

pytestmark = pytest.mark.integration
ONE_PER_FAMILY = ["h100", "b300", "mi355x", "ironwood", "xeon6"]  # gaudi2: test_gaudi_image.py


@pytest.fixture(scope="module")
def built(client, m, cpu_base, cuda_standin):
    bases, tags = {}, {}
    for name in ONE_PER_FAMILY:
        cuda = m.targets[name].base.cuda
        bases[name] = cuda_standin(cuda) if cuda else cpu_base
        tags[name] = images.build_target(
            client,
            m,
            name,
            base_override=bases[name],
            tokenizer_source=str(tiny_model.ensure()),
            tag=f"gemma4-e2b-test/{name}:standin",
            log=print,
        )
    return bases, tags


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_print_command_in_image_is_the_recipe_launch(client, m, built, name):
    out = client.containers.run(built[1][name], ["--print-command"], remove=True, network_mode="host")
    assert shlex.split(out.decode()) == m.recipe_launch(name)


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_labels_and_build_json_agree_with_targets_yaml(client, m, built, name):
    bases, tags = built
    image = client.images.get(tags[name])
    labels = image.labels
    assert labels["io.gemma4-images.target"] == name
    assert labels["io.gemma4-images.vllm-version"] == m.project.vllm_version
    assert labels["org.opencontainers.image.base.name"] == bases[name]
    assert labels["org.opencontainers.image.base.digest"] == client.images.get(bases[name]).id
    assert labels["org.opencontainers.image.version"] == m.tag(name).split(":")[1]
    assert labels["org.opencontainers.image.revision"] == facts.revision()
    assert labels["org.opencontainers.image.created"] == facts.created()
    info = running.build_json(client, tags[name])
    assert info == {label: labels[label] for label in BUILD_FACTS}


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_healthcheck_entrypoint_env_and_files(client, m, built, name):
    config = client.images.get(built[1][name]).attrs["Config"]
    assert config["Healthcheck"]["Test"] == ["CMD", "gemma4-serve", "--healthcheck"]
    budget = max(m.targets[n].startup_budget_s for n in m.family_targets(m.targets[name].family))
    assert config["Healthcheck"]["StartPeriod"] == budget * 10**9
    assert config["Entrypoint"] == ["gemma4-serve"]
    env = dict(e.split("=", 1) for e in config["Env"])
    for key, value in m.families[m.targets[name].family].env.items():
        assert env[key] == value
    # Every file any selectable feature names is in the image (the build's self-check ran too).
    out = client.containers.run(built[1][name], ["--self-check"], remove=True, network_mode="host")
    assert out == b""


def test_healthcheck_fails_when_nothing_serves(client, built):
    container = client.containers.run(built[1]["h100"], ["--healthcheck"], detach=True, network_mode="host")
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def older_vllm_base(standin):
    """Made before the test's leftover counts start (a rebuilt fixed tag leaves its old image `<none>`)."""
    return standin("0.29.0")


def test_version_mismatch_fails_the_build_and_tags_nothing(
    client, m, older_vllm_base, untagged, no_new_containers, no_new_dangling_images
):
    base = older_vllm_base
    tag = untagged("gemma4-e2b-test/mismatch:standin")
    with pytest.raises(BuildFailed) as e:
        images.build_target(client, m, "h100", base_override=base, tag=tag, log=print)
    # The fixes pack's guard is the first step to look at the base's vLLM.
    assert "apply_all.py" in e.value.step
    assert any("expected 0.30.0" in line and "0.29.0" in line for line in e.value.tail), e.value.tail
    with pytest.raises(ImageNotFound):
        client.images.get(tag)


def test_facts_are_reproducible(m, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = facts.facts(m, "h100", "b", "d")
    assert first == facts.facts(m, "h100", "b", "d")
    assert first["GEMMA4_CREATED"] == "2023-11-14T22:13:20Z"
