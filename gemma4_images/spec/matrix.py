"""Load and validate targets.yaml, the one table every other module reads."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from gemma4_images.spec import platforms

ROOT = Path(__file__).resolve().parents[2]  # gemma4_images/spec/matrix.py -> the checkout
TARGETS_FILE = ROOT / "targets.yaml"
# One file per vLLM release, every one of the same form: the facts bound to that release, written by
# `build.py bump` (gemma4_images/build/bump.py). load(vllm=V) lays it over targets.yaml, which holds
# what no release changes; release_overlay says how.
RELEASES = ROOT / "releases"
PROFILES = ROOT / "patches" / "profiles"
FEATURES = ("tool_calling", "reasoning", "text_only", "spec_decoding", "fast_prefill")
RESERVED_NAMES = ("all",)  # CLI words that stand for every target
SHA256_DIGEST = r"^sha256:[0-9a-f]{64}$"
# Where images hold the BOS tokenizer copy (patches/gemma4-bos-tokenizer) when a target bakes it.
TOKENIZER_PATH = "/opt/gemma4-e2b/tokenizer"
# Where a model image holds its files (/models/<name>), and where pods and containers mount them.
MODELS_ROOT = "/models"


def model_path(name: str) -> str:
    return f"{MODELS_ROOT}/{name}"


class MatrixError(Exception):
    """targets.yaml is malformed or a name in it does not resolve."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Heads(Strict):
    count: int  # the text model's attention heads: tensor parallelism must divide them
    source: str


class Project(Strict):
    image: str
    model: str
    architecture: str
    vllm_version: str
    transformers_version: str
    source: str
    port: int
    checkpoint_gb: float  # the model's weights as published, in GB (10^9 bytes)
    attention_heads: Heads


class Variant(Strict):
    model: str | None
    note: str
    families: list[str] | None = None


class UpstreamFile(Strict):
    sdist: str
    sdist_sha256: str
    member: str


class Present(Strict):
    """How `smoke` tells that the device is there before it starts a container: a container runtime
    docker knows, or a device path (any of the globs matching)."""

    docker_runtime: str | None = None
    paths: list[str] = []


class Security(Strict):
    mode: Literal["non-root", "root", "root+SYS_NICE", "privileged"]
    why: str


class CompileCache(Strict):
    """The family's compile caches beyond vLLM's own (VLLM_CACHE_ROOT), pointed into the pod's
    compile-cache volume: env values may name that volume's path as {cache}."""

    env: dict[str, str] = {}
    # Read from local disk only: a shared claim seeds the pod's own volume (an init container copies
    # it) instead of being used in place.
    local: bool = False
    why: str = ""


class HostResources(Strict):
    """What a pod asks of its node besides the device (generate/k8s.py resources)."""

    cpus: int | None = None  # None: one per busy vLLM process (k8s.py busy_processes)
    # The KV cache held in host memory (CPU family: VLLM_CPU_KVCACHE_SPACE in the pod), GiB.
    kv_cache_gib: int | None = None
    why: str


class FamilyKubernetes(Strict):
    """How a pod gets what `docker run` gives the container."""

    device_resource: str | None = None  # the device plugin's extended resource
    # Env the recipe's `docker run` sets that a device plugin sets per pod instead.
    plugin_env: list[str] = []
    security: Security
    compile_cache: CompileCache = CompileCache()
    resources: HostResources


class Family(Strict):
    accelerator: Literal["habana", "nvidia", "amd", "none", "tpu"]
    about: str  # the head comment of Dockerfile.<family>
    # Rendered into Dockerfile.<family> as ENV, so it is one value for every target of the family.
    env: dict[str, str] = {}
    present: Present = Present()
    kubernetes: FamilyKubernetes
    # The PyPI distributions carrying this family's vLLM at project.vllm_version, its vLLM first.
    pypi: list[str]
    audio_extras: list[str] = []  # added to Matrix.audio_extras for this family's targets
    # Set for the build's self-check only (it runs on the build host, with no device): not in the
    # image, whose device and platform are the ones it is deployed on.
    self_check_env: dict[str, str] = {}
    # The labels of the self-hosted CI runner a release job of the family runs on (its hardware).
    runner: list[str]


class Standin(Strict):
    """A base built here with no registry (`build.py base TARGET`) in place of a vendor image: a
    Debian root filesystem and the real PyPI packages `lock` pins, installed by `dockerfile`."""

    tag: str
    dockerfile: str  # relative to the repository
    lock: str  # relative to the repository; `make lock` writes it from requirements()
    family: str  # whose targets it serves; its vLLM distribution is the family's pypi[0]
    stands_for: str
    proves: str
    python: str = "3.11"  # the Python the lock is resolved for: the root filesystem's, or interpreter's
    platform: str = platforms.DEFAULT  # what its root filesystem, wheels and image are built for
    # Pins that replace a dependency's own (uv pip compile --override), each with its reason in
    # targets.yaml: what the stand-in's vLLM wants is not on PyPI for this platform.
    overrides: list[str] = []
    # A host directory holding a CPython install of version `python`, copied into the stand-in when
    # Debian's root filesystem carries another Python (localbase.interpreter_tar says what is kept).
    interpreter: str | None = None

    @property
    def dockerfile_path(self) -> Path:
        return ROOT / self.dockerfile

    @property
    def lock_path(self) -> Path:
        return ROOT / self.lock


class PlatformImage(Strict):
    """A base as published for one platform."""

    image: str
    digest: str | None = None
    standin: str | None = None  # a key of `standins`: what `build.py base` builds for this base
    no_standin: str | None = None  # why there is none (what `build.py base` says)
    # The CUDA runtime the base's torch is built for (torch.version.cuda); the build's self-check
    # refuses a base that carries another one.
    cuda: str | None = None

    @field_validator("digest")
    @classmethod
    def _digest_form(cls, v):
        import re

        if v is not None and not re.match(SHA256_DIGEST, v):
            raise ValueError("must look like sha256:<64 hex digits> (or be null)")
        return v

    @property
    def ref(self) -> str:
        """The reference to pull: pinned by digest when one is known."""
        return f"{self.image}@{self.digest}" if self.digest else self.image


class OtherPlatform(PlatformImage):
    source: str  # where the vendor publishes the base for this platform


class Image(PlatformImage):
    """A target's base: itself for linux/amd64 (platforms.DEFAULT), `platforms` for the others the
    vendor publishes it for."""

    platforms: dict[str, OtherPlatform] = {}

    @field_validator("platforms")
    @classmethod
    def _known_platforms(cls, v):
        for name in v:
            if name not in platforms.KNOWN or name == platforms.DEFAULT:
                others = [p for p in platforms.KNOWN if p != platforms.DEFAULT]
                raise ValueError(f"{name!r} is not one of {', '.join(others)} (the base itself is {platforms.DEFAULT})")
        return v

    def on(self, platform: str) -> PlatformImage:
        return self if platform == platforms.DEFAULT else self.platforms[platform]


class Stage1(Image):
    vllm_commit: str
    vllm_gaudi_commit: str


class Serve(Strict):
    model_arg: Literal["positional", "flag"]
    args: list[str]
    default_features: list[str]
    features: dict[str, list[str]] = {}
    unsupported_features: dict[str, str] = {}
    # Strategies (Matrix.strategies) the target's recipe does not allow, each with why.
    unsupported_strategies: dict[str, str] = {}
    # What the target's vLLM cannot serve, each with why: the launch limits it to 0 per prompt and
    # refuses a launch that asks for it; without audio the image gets no audio extras.
    unsupported_modalities: dict[Literal["image", "audio", "video"], str] = {}

    @field_validator("default_features")
    @classmethod
    def _known_defaults(cls, v):
        return _check_feature_names(v)

    @field_validator("features", "unsupported_features")
    @classmethod
    def _known_keys(cls, v):
        _check_feature_names(list(v))
        return v


class EnvLimit(Strict):
    max: int
    message: str


class Guards(Strict):
    refuse_env: dict[str, str] = {}
    warn_env_above: dict[str, EnvLimit] = {}
    warn_flags: dict[str, str] = {}


class Smoke(Strict):
    """How `build.py smoke` runs this target, beyond its recipe launch."""

    env: dict[str, str] = {}
    args: list[str] = []
    shm_size: str | None = None
    user: str | None = None
    # Where torch inductor keeps what it compiles in the container (its default cache folder for the
    # smoke's user), kept on this machine between smoke runs (server.compile_cache_dir): compiled
    # once per machine, not once per container, with nothing else about the run changed.
    compile_cache: str | None = None


class Run(Strict):
    """The recipe's `docker run` options as data: running.docker_flags writes the command line,
    running.sdk_kwargs the Docker SDK's arguments, k8s the pod spec, all from these fields."""

    runtime: str | None = None
    gpus: str | None = None
    env: dict[str, str] = {}  # set to these values
    pass_env: list[str] = []  # passed through from the caller's environment (`-e NAME`)
    privileged: bool = False
    cap_add: list[str] = []
    devices: list[str] = []
    group_add: list[str] = []
    security_opt: list[str] = []
    ipc: str | None = None
    network: str | None = None
    shm_size: str | None = None
    volumes: dict[str, str] = {}  # host path: container path
    publish: list[str] = []


class TargetKubernetes(Strict):
    node_selector: dict[str, str] = {}
    devices: int = 1  # how many of the family's device_resource the pod requests


class Fixes(Strict):
    profile: str
    opt_in: list[str] = []


class Target(Strict):
    family: str
    hardware: str
    base: Image
    stage1: Stage1 | None = None
    aliases: list[str] = []
    serve: Serve
    guards: Guards = Guards()
    notes: list[str] = []
    run: Run
    kubernetes: TargetKubernetes = TargetKubernetes()
    startup_budget_s: int
    recipe_launch: str
    smoke: Smoke = Smoke()
    fixes: Fixes | None = None
    bos_tokenizer: bool = False
    # How long a stop (SIGTERM) may take before the kill: the pod's terminationGracePeriodSeconds.
    shutdown_grace_s: int = 30

    @property
    def audio(self) -> bool:
        """Whether the image installs the audio extras (Matrix.audio_extras) and serves audio."""
        return "audio" not in self.serve.unsupported_modalities

    @property
    def opt_in_fixes(self) -> list[str]:
        return self.fixes.opt_in if self.fixes else []


class Default(Strict):
    """A family's default vLLM release: what `build.py` builds without --vllm, and what the plain
    <target> tag follows."""

    vllm: str
    source: str  # why this release: the recipe's pin, or the newest release proven here


class Matrix(Strict):
    project: Project
    defaults: dict[str, Default]  # family -> its default release
    audio_extras: list[str]
    features: dict[str, list[str]]
    strategies: dict[str, str]  # the recipe page's strategy toggle: name -> what it does
    variants: dict[str, Variant]
    upstream_files: dict[str, UpstreamFile]
    families: dict[str, Family]
    standins: dict[str, Standin]
    targets: dict[str, Target]
    # Targets of targets.yaml this release does not build, each with why (resolve's message).
    not_in_release: dict[str, str] = {}
    first_release: bool = False  # the oldest release of releases/, whose reports keep their plain names

    @field_validator("features")
    @classmethod
    def _all_features(cls, v):
        missing = set(FEATURES) - set(v)
        if missing or set(v) - set(FEATURES):
            raise ValueError(f"must define exactly the features {', '.join(FEATURES)}")
        return v

    @model_validator(mode="after")
    def _cross_references(self):
        names = set(self.targets)
        for key, s in self.standins.items():
            family = self.families.get(s.family)
            if family is None or not family.pypi:
                raise ValueError(f"standins.{key}.family: {s.family!r} is not a family whose vLLM is on PyPI")
        for key, s in self.standins.items():
            if s.platform not in platforms.KNOWN:
                raise ValueError(f"standins.{key}.platform: {s.platform!r} is not one of {', '.join(platforms.KNOWN)}")
        for name, t in self.targets.items():
            for platform in [platforms.DEFAULT, *t.base.platforms]:
                where = f"targets.{name}.base" + ("" if platform == platforms.DEFAULT else f".platforms.{platform}")
                key = t.base.on(platform).standin
                if key is None:
                    continue
                if key not in self.standins:
                    raise ValueError(f"{where}.standin: unknown stand-in {key!r}; known: {', '.join(self.standins)}")
                if self.standins[key].family != t.family:
                    raise ValueError(
                        f"{where}.standin: {key!r} stands in for the "
                        f"{self.standins[key].family} family's base, {name} is {t.family}"
                    )
                if self.standins[key].platform != platform:
                    raise ValueError(f"{where}.standin: {key!r} is built for {self.standins[key].platform}")
            if t.family not in self.families:
                raise ValueError(
                    f"targets.{name}.family: unknown family {t.family!r}; known: {', '.join(self.families)}"
                )
            for alias in t.aliases:
                if alias in names:
                    raise ValueError(f"targets.{name}.aliases: {alias!r} is already a target name")
                if alias in RESERVED_NAMES:
                    raise ValueError(
                        f"targets.{name}.aliases: {alias!r} is reserved (`build.py build {alias}` "
                        "means every target); choose another alias"
                    )
                names.add(alias)
        for name, t in self.targets.items():
            if t.fixes:
                profile = load_profile(t.fixes.profile)
                if profile is None:
                    raise ValueError(
                        f"targets.{name}.fixes.profile: no profile {t.fixes.profile!r} in "
                        f"patches/profiles/; known: {', '.join(p.stem for p in PROFILES.glob('*.json'))}"
                    )
                # A Gaudi image needs a profile that requires vllm_gaudi, any other image one that does not.
                gaudi = self.families[t.family].accelerator == "habana"
                if gaudi != ("vllm_gaudi" in profile["requires"]):
                    fits = [
                        p.stem
                        for p in sorted(PROFILES.glob("*.json"))
                        if ("vllm_gaudi" in load_profile(p.stem)["requires"]) == gaudi
                    ]
                    raise ValueError(
                        f"targets.{name}.fixes.profile: {t.fixes.profile!r} is for "
                        f"{'vllm-gaudi' if not gaudi else 'plain vLLM'} images, {name} is "
                        f"{'a Gaudi' if gaudi else 'not a Gaudi'} target; use {' or '.join(fits)}"
                    )
                unknown = [f for f in t.fixes.opt_in if f not in profile["opt_in"]]
                if unknown:
                    raise ValueError(
                        f"targets.{name}.fixes.opt_in: {', '.join(unknown)} not opt-in fixes of "
                        f"{t.fixes.profile}; those are {', '.join(profile['opt_in'])}"
                    )
        return self

    # -- lookups -----------------------------------------------------------------------------

    # Lookups below take a target's own name; the CLI resolves aliases once, at its boundary.
    def resolve(self, name: str) -> str:
        """Target name for a name or alias, or a MatrixError listing the valid ones."""
        if name in self.targets:
            return name
        for tname, t in self.targets.items():
            if name in t.aliases:
                return tname
        if name in self.not_in_release:
            raise MatrixError(self.not_in_release[name])
        valid = ", ".join(sorted(self.targets) + sorted(a for t in self.targets.values() for a in t.aliases))
        raise MatrixError(f"unknown target {name!r}; valid targets: {valid}")

    def standin_distributions(self, key: str) -> list[str]:
        """The PyPI distributions of a stand-in's vLLM: its family's (vllm-tpu with tpu-inference)."""
        return self.families[self.standins[key].family].pypi

    def audio_extras_of(self, name: str) -> list[str]:
        """What a target with audio installs: vLLM's audio extra and its family's additions."""
        return self.audio_extras + self.families[self.targets[name].family].audio_extras

    def platforms(self, name: str) -> list[str]:
        """The platforms the target's base is published for, linux/amd64 first."""
        return [platforms.DEFAULT, *self.targets[name].base.platforms]

    def platform(self, name: str, platform: str | None) -> platforms.Platform:
        """platform (None: the default) when the target's base is published for it, else one line."""
        p = platforms.parse(platform)
        if p.name not in self.platforms(name):
            raise MatrixError(
                f"{name} is not built for {p.name}: its base is published for {', '.join(self.platforms(name))} "
                "only (targets.yaml base.platforms)"
            )
        return p

    def base_on(self, name: str, platform: str | None = None) -> PlatformImage:
        """The target's base for platform (None: the default)."""
        return self.targets[name].base.on(self.platform(name, platform).name)

    def standin(self, name: str, platform: str | None = None) -> Standin | None:
        """The stand-in `build.py base` builds for the target's base on platform, if it has one."""
        key = self.base_on(name, platform).standin
        return self.standins[key] if key else None

    def standin_targets(self, key: str) -> list[str]:
        """The targets whose base on the stand-in's platform is that stand-in."""
        on = self.standins[key].platform
        return [n for n in self.targets if on in self.platforms(n) and self.base_on(n, on).standin == key]

    def tag(self, name: str, platform: str | None = None) -> str:
        """The local tag of the target's image for platform (None: the default platform's, which
        is also what the registry's multi-platform index is called)."""
        suffix = platforms.parse(platform).tag_suffix
        return f"{self.project.image}:{self.version_name(name)}{suffix}"

    @property
    def report_release(self) -> str | None:
        """What reports of this release's images are filed under besides the target (reports.key):
        None for the first release, whose reports kept their plain names before there were others."""
        return None if self.first_release else self.project.vllm_version

    def version_name(self, name: str) -> str:
        """<target>-v<vllm>: the tag's own part, the image's version label and its recipe's name."""
        return f"{name}-v{self.project.vllm_version}"

    def recipe_file(self, name: str) -> str:
        """The target's recipe at this release, relative to the repository (the Dockerfile COPYs it)."""
        return f"image/recipes/{self.version_name(name)}.json"

    def tiny_tag(self, name: str, platform: str | None = None) -> str:
        """Images that bake the tiny test model's tokenizer never carry the real tag."""
        return f"{self.tag(name, platform)}-tiny"

    def family_targets(self, family: str) -> list[str]:
        return [n for n, t in self.targets.items() if t.family == family]

    def recipe(self, name: str) -> dict:
        """What the image's entrypoint needs to build the launch: baked as /etc/gemma4-e2b/recipe.json."""
        t = self.targets[name]
        features = {
            f: t.serve.features.get(f, flags)
            for f, flags in self.features.items()
            if f not in t.serve.unsupported_features
        }
        variants = {
            v: {"model": var.model, "note": var.note}
            for v, var in self.variants.items()
            if var.families is None or t.family in var.families
        }
        return {
            "target": name,
            "family": t.family,
            "hardware": t.hardware,
            "vllm_version": self.project.vllm_version,
            "port": self.project.port,
            "command": ["vllm", "serve"],
            "model": self.project.model,
            "architecture": self.project.architecture,
            # The recipe's model and its variants are E2B: their heads, for a split asked of a hub id.
            "attention_heads": {
                "count": self.project.attention_heads.count,
                "models": [self.project.model, *(v["model"] for v in variants.values() if v["model"])],
            },
            "model_arg": t.serve.model_arg,
            "args": t.serve.args,
            "default_features": t.serve.default_features,
            "features": features,
            "unsupported_features": t.serve.unsupported_features,
            # Each strategy: null where the target allows it, else why not (the entrypoint says it).
            "strategies": {s: t.serve.unsupported_strategies.get(s) for s in self.strategies},
            "tokenizer": TOKENIZER_PATH if t.bos_tokenizer else None,
            "unsupported_modalities": t.serve.unsupported_modalities,
            # What the self-check holds the base to, and the bases to name when it does not fit.
            "cuda": t.base.cuda,
            "cuda_bases": {
                o.base.cuda: o.base.image for o in self.targets.values() if o.family == t.family and o.base.cuda
            },
            "variants": variants,
            "guards": t.guards.model_dump(),
            "notes": t.notes,
        }

    def fixes(self, name: str) -> list[str]:
        """The fixes the target's image carries, in the pack's order."""
        t = self.targets[name]
        if not t.fixes:
            return []
        profile = load_profile(t.fixes.profile)
        return profile["generic"] + [f for f in profile["opt_in"] if f in t.fixes.opt_in]

    def recipe_launch(self, name: str) -> list[str]:
        """The recipe's launch as written in the seeds, as the image serves it: with the baked
        tokenizer's path where the target bakes the BOS copy (000 names its own /tmp path for it),
        and what it cannot serve limited to 0 per prompt (serve.unsupported_modalities)."""
        from gemma4_images.spec.image_code import gemma4_serve  # it reads this module's ROOT

        t = self.targets[name]
        launch = shlex.split(t.recipe_launch) + (["--tokenizer", TOKENIZER_PATH] if t.bos_tokenizer else [])
        for modality, why in t.serve.unsupported_modalities.items():
            launch = gemma4_serve.refuse_modality(self.recipe(name), launch, modality, why)
        return launch


def dockerfile_name(family: str) -> str:
    return f"Dockerfile.{family}"


def load_profile(name: str) -> dict | None:
    path = PROFILES / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _check_feature_names(names):
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
    return names


def _named(loader, path):
    loader.name = str(path)
    return loader


def _location(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-"))


# Lists of names, where an entry given twice is a slip (a fix, feature or alias counted once),
# never an intent; `args` and the like may repeat a value and are not here.
NAME_LISTS = {"opt_in", "aliases", "default_features", "audio_extras", "pypi", "pass_env", "cap_add", "group_add"}


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently),
    and an entry given twice in one of the NAME_LISTS. Merge keys (`<<: *anchor`) still work:
    keys a merge brings in may be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if not isinstance(key, (str, int, float, bool, type(None))):
                    continue  # the constructor below refuses unhashable keys itself
                if key in seen:
                    raise MatrixError(
                        f"{self.name}: key {key!r} is given twice in one mapping (lines "
                        f"{seen[key]} and {line}); the second would silently replace the "
                        "first: remove or rename one"
                    )
                seen[key] = line
            for key_node, value_node in node.value:
                named = isinstance(key_node, yaml.ScalarNode) and key_node.value in NAME_LISTS
                if named and isinstance(value_node, yaml.SequenceNode):
                    self._distinct_items(key_node.value, value_node)
        return super().construct_mapping(node, deep=deep)

    def _distinct_items(self, key: str, node) -> None:
        first: dict = {}
        for item in node.value:
            if not isinstance(item, yaml.ScalarNode):
                continue
            where = f"line {item.start_mark.line + 1} column {item.start_mark.column + 1}"
            if item.value in first:
                raise MatrixError(
                    f"{self.name}: {key} names {item.value!r} twice ({first[item.value]} and {where}); "
                    "each entry counts once: remove one"
                )
            first[item.value] = where


def _read(path: Path, what: str) -> dict:
    try:
        text = Path(path).read_text()
        raw = yaml.load(text, Loader=lambda stream: _named(_UniqueKeyLoader(stream), path))  # noqa: S506
    except OSError as e:
        raise MatrixError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise MatrixError(f"{path} is not valid YAML: {e}") from None
    if raw is None:
        raise MatrixError(f"{path} is empty: it must define {what}")
    if not isinstance(raw, dict):
        raise MatrixError(f"{path}: expected a mapping at the top level")
    return raw


def version_key(version: str) -> tuple:
    """Sorts release numbers as numbers (0.9.0 before 0.10.0)."""
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def release_file(version: str, releases: Path = RELEASES) -> Path:
    return releases / f"vllm-{version}.yaml"


def releases(path: Path = TARGETS_FILE, releases_dir: Path = RELEASES) -> list[str]:
    """Every vLLM release images are built on (a releases/vllm-V.yaml each), oldest first."""
    found = [p.name[len("vllm-") : -len(".yaml")] for p in releases_dir.glob("vllm-*.yaml")]
    if not found:
        raise MatrixError(f"{releases_dir} holds no vllm-VERSION.yaml: targets.yaml needs at least one release")
    return sorted(found, key=version_key)


# A release file's top-level keys (`release` is the record of how the file was made and where its
# facts come from, not a fact of the images); every one but `release` is required. Under `project`
# each key joins targets.yaml's; under `standins` and `targets` each entry's keys join that entry's (a
# target's `base` key by key, and each of its platforms key by key), and only the targets listed are
# built on the release.
RELEASE_KEYS = {"release", "project", "audio_extras", "upstream_files", "standins", "targets"}
# What each target a release builds must say at that release (none of it is in targets.yaml).
RELEASE_TARGET_KEYS = ("base", "fixes")


# What only a release file may say (targets.yaml giving one would be shadowed by every release's):
# top-level keys, and per section the keys bound to a vLLM release.
RELEASE_BOUND = {
    "": ("release", "audio_extras", "upstream_files"),
    "project": ("vllm_version", "transformers_version"),
    "standins.*": ("tag", "stands_for", "lock", "overrides"),
    "targets.*": ("fixes", "stage1"),
    "targets.*.base": ("image", "digest"),
    "targets.*.base.platforms.*": ("image", "digest"),
}


def release_bound_in(raw: dict) -> list[str]:
    """The paths in targets.yaml's data that only a release file may hold (RELEASE_BOUND)."""
    found = []
    for section, keys in RELEASE_BOUND.items():
        nodes = [("", raw)]
        for part in [p for p in section.split(".") if p]:
            step = []
            for at, node in nodes:
                children = (node or {}).items() if part == "*" else [(part, (node or {}).get(part))]
                step += [(f"{at}.{k}".lstrip("."), v) for k, v in children if isinstance(v, dict)]
            nodes = step
        found += [f"{at}.{k}".lstrip(".") for at, node in nodes for k in keys if k in node]
    return found


def release_overlay(raw: dict, rel: dict, where: str, version: str) -> dict:
    """targets.yaml's data (raw) at the release rel describes, read from where, the file of vLLM
    version: it carries every fact bound to the release; targets.yaml holds none of them."""
    unknown = sorted(set(rel) - RELEASE_KEYS)
    if unknown:
        raise MatrixError(
            f"{where}: unknown key(s) {', '.join(unknown)}; a release file has {', '.join(sorted(RELEASE_KEYS))}"
        )
    lacking = sorted(RELEASE_KEYS - {"release"} - set(rel))
    if lacking:
        raise MatrixError(
            f"{where}: {', '.join(lacking)} missing: a release file holds every fact bound to its release "
            "(as `build.py bump` writes it)"
        )
    given = (rel.get("project") or {}).get("vllm_version")
    if given is None or str(given) != version:  # it names the tags: another would tag another release's images
        said = "missing" if given is None else repr(str(given))
        raise MatrixError(f"{where}: project.vllm_version is {said}, not {version} (the release its file name says)")
    out = {**raw, "project": {**raw["project"], **rel.get("project", {})}}
    for key in ("audio_extras", "upstream_files"):
        if key in rel:
            out[key] = rel[key]
    standins = dict(raw.get("standins", {}))
    for key, fields in rel.get("standins", {}).items():
        if key not in standins:
            raise MatrixError(f"{where}: standins.{key} is not a stand-in of targets.yaml")
        standins[key] = {**standins[key], **fields}
    targets = {}
    for name, fields in rel.get("targets", {}).items():
        if name not in raw["targets"]:
            raise MatrixError(f"{where}: targets.{name} is not a target of targets.yaml")
        family = (raw.get("families") or {}).get(raw["targets"][name].get("family")) or {}
        wanted = [*RELEASE_TARGET_KEYS, *(["stage1"] if family.get("accelerator") == "habana" else [])]
        gone = [key for key in wanted if key not in (fields or {})]
        if gone:
            raise MatrixError(
                f"{where}: targets.{name}.{gone[0]} is missing: a target this release builds needs its {gone[0]} "
                f"at vLLM {version} (as `build.py bump` writes it; `{gone[0]}: null` if it has none)"
            )
        own = raw["targets"][name].get("base") or {}
        base = (fields or {}).get("base") or {}
        images = {"": base} | {
            f".platforms.{p}": base.get("platforms", {}).get(p, {}) for p in own.get("platforms", {})
        }
        gap = next((at for at, image in images.items() if "image" not in image), None)
        if gap is not None:  # else the release's tag would be built on targets.yaml's base
            raise MatrixError(
                f"{where}: targets.{name}.base{gap}.image is missing: a target this release builds needs its base "
                f"at vLLM {version} on each of its platforms (as `build.py bump` writes it)"
            )
        # A base's keys, and each of its platforms' keys, replace their own.
        platforms_ = {
            p: {**own.get("platforms", {}).get(p, {}), **image} for p, image in base.get("platforms", {}).items()
        }
        targets[name] = {**raw["targets"][name], **fields}
        targets[name]["base"] = {**own, **base, "platforms": {**own.get("platforms", {}), **platforms_}}
        if targets[name]["fixes"] is None:
            del targets[name]["fixes"]
    missing = {}
    for name, t in raw["targets"].items():
        if name not in targets:
            why = (
                f"{name} is not built on vLLM {version} (releases/ has no {name} entry for it); drop --vllm for its own"
            )
            missing.update({n: why for n in [name, *t.get("aliases", [])]})
    used = {
        image.get("standin")
        for t in targets.values()
        for image in [t["base"], *t["base"].get("platforms", {}).values()]
    }
    out["standins"] = {k: v for k, v in standins.items() if k in used}
    out["targets"] = targets
    out["not_in_release"] = missing
    return out


def load(path: Path = TARGETS_FILE, vllm: str | None = None, releases_dir: Path = RELEASES) -> Matrix:
    """Parse and validate targets.yaml, at the vLLM release vllm (None: the first release, the oldest
    of releases/); every problem is reported with the field path it concerns."""
    raw = _read(path, "project, features, variants, families and targets (see the committed targets.yaml)")
    known = releases(path, releases_dir)
    vllm = vllm or known[0]
    rel_path = release_file(vllm, releases_dir)
    if vllm not in known:
        raise MatrixError(
            f"no vLLM {vllm} release here (known: {', '.join(known)}); "
            f"add one with `python build.py bump FAMILY --vllm {vllm}`"
        )
    bound = release_bound_in(raw)
    if bound:
        raise MatrixError(
            f"{path}: {', '.join(bound)} is bound to a vLLM release: it belongs in each releases/vllm-<V>.yaml "
            "(as `build.py bump` writes it), not in targets.yaml"
        )
    family_of = {name: (t or {}).get("family") for name, t in (raw.get("targets") or {}).items()}
    raw = release_overlay(raw, _read(rel_path, "the release's facts"), rel_path, vllm)
    raw["first_release"] = vllm == known[0]
    unbuilt = [n for n in family_of if n not in raw["targets"]]
    if raw["first_release"] and unbuilt:  # list, aliases and each target's default are read there
        raise MatrixError(f"{rel_path}: the first release builds every target; {', '.join(unbuilt)} missing")
    where = f"{path} at {rel_path.name}"
    try:
        m = Matrix.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where_key = _location(err["loc"]) or "(top level)"
            msg = (
                "unknown key (not in the schema; check its spelling)"
                if err["type"] == "extra_forbidden"
                else err["msg"]
            )
            lines.append(f"  {where_key}: {msg}")
        raise MatrixError(f"{where} is invalid:\n" + "\n".join(lines)) from None
    _check_defaults(m, path, known, releases_dir, family_of)
    return m


def _check_defaults(m: Matrix, path: Path, known: list[str], releases_dir: Path, family_of: dict) -> None:
    """Every family has a default release, and that release builds every target of the family
    (family_of: each target of targets.yaml, built at m's release or not, -> its family)."""
    built: dict[str, set] = {}
    for family in m.families:
        if family not in m.defaults:
            raise MatrixError(
                f"{path}: defaults.{family} is missing: say which vLLM release the family builds by default"
            )
    for family, default in m.defaults.items():
        if family not in m.families:
            raise MatrixError(f"{path}: defaults.{family}: not a family of targets.yaml")
        if default.vllm not in known:
            raise MatrixError(
                f"{path}: defaults.{family}.vllm: no vLLM {default.vllm} release here (known: {', '.join(known)}); "
                f"add one with `python build.py bump {family} --vllm {default.vllm}`"
            )
        if default.vllm not in built:  # each release file read once, however many families name it
            rel = _read(release_file(default.vllm, releases_dir), "the release's facts")
            built[default.vllm] = set(rel.get("targets") or {})
        lacking = [n for n, f in family_of.items() if f == family and n not in built[default.vllm]]
        if lacking:
            raise MatrixError(
                f"{path}: defaults.{family}.vllm: vLLM {default.vllm} does not build {', '.join(lacking)}; "
                f"add them with `python build.py bump {' '.join(lacking)} --vllm {default.vllm}`"
            )


def default_release(matrix: Matrix, name: str) -> str:
    """The release target name is built on without --vllm: its family's default."""
    return matrix.defaults[matrix.targets[name].family].vllm


def load_default(name: str, path: Path = TARGETS_FILE, releases_dir: Path = RELEASES) -> Matrix:
    """targets.yaml at target name's default release (its family's)."""
    return load(path, default_release(load(path, None, releases_dir), name), releases_dir)


def releases_of(name: str, path: Path = TARGETS_FILE, releases_dir: Path = RELEASES) -> list[str]:
    """The vLLM releases target name is built on, in release order."""
    return [v for v, view in views(path, releases_dir).items() if name in view.targets]


def views(path: Path = TARGETS_FILE, releases_dir: Path = RELEASES) -> dict[str, Matrix]:
    """targets.yaml at each release, in release order."""
    return {v: load(path, v, releases_dir) for v in releases(path, releases_dir)}
