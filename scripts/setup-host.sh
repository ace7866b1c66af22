#!/usr/bin/env bash
# Make a fresh Debian machine ready to build and test: the Docker engine (started when none
# answers), mmdebstrap for registry-free bases, and the project's Python venv.
# Used by `make` and by .ci/run; safe to run again (it only does what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

# packages: only the Debian packages (what the quick start's benchmark times on a fresh Debian
# container, gemma4_images/bench/quickstart.py); build or test: those, the engine and the venv.
want=${1:-test}
case "$want" in build|test|packages) ;; *) echo "usage: setup-host.sh [build|test|packages]" >&2; exit 2 ;; esac

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v docker-registry >/dev/null || need_apt+=(docker-registry)   # push tests: a real registry on 127.0.0.1
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)           # ... and one that wants a login
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-host: installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
[ "$want" = packages ] && exit 0
# cosign for signed pushes (bookworm has none): the tests sign and verify with it.
[ "$want" = test ] && scripts/setup-tools.sh

# The Debian package's own client speaks the daemon's API; any client works for `info`.
if ! docker info >/dev/null 2>&1; then
  echo "setup-host: starting dockerd (no bridge: every build and container uses host networking)" >&2
  nohup dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
    >/var/log/gemma4-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup-host: dockerd did not start; see /var/log/gemma4-dockerd.log" >&2; exit 1; }
fi

# The venv holds exactly one lock, hashes checked, installed by uv (itself locked; seconds, where
# pip took about two minutes): requirements/build.lock for building and serving (`setup-host.sh
# build`: a tenth of the size, no torch), or requirements/test.lock, which pins all of build.lock
# too (scripts/lock.sh), for the tests (the default). torch's CPU build comes from the local wheel
# folder pip's configuration names on these machines.
have=$(cat .venv/.installed 2>/dev/null || true)   # the lock the venv was last synced from
# A test venv stays one: syncing it down to build.lock would only be undone by the next `make test`.
[ "$want" = build ] && [ "$have" = test ] && want=test
if [ "$have" != "$want" ] || [ "requirements/$want.lock" -nt .venv/.installed ]; then
  [ -x .venv/bin/python ] || python3 -m venv --without-pip .venv
  # uv goes in with the system's pip when it can install into the venv (pip --python, 22.3+):
  # ensurepip took 7 s of a fresh venv's 13 s. Else the venv gets its own pip first. Either way
  # the lock then brings the venv its own pip (the wheelhouse downloads run it).
  pip=(.venv/bin/python -m pip)
  if [ ! -x .venv/bin/pip ]; then
    if python3 -m pip --python .venv/bin/python --version >/dev/null 2>&1; then
      pip=(python3 -m pip --python .venv/bin/python)
    else
      .venv/bin/python -m ensurepip --default-pip >/dev/null \
        || { echo "setup-host: cannot give .venv a pip: apt-get install python3-venv" >&2; exit 1; }
    fi
  fi
  # uv's own entry of the lock, every hash line of it
  awk '/^uv==/{on=1} on && !/^ *#/{print} on && !/\\$/{exit}' "requirements/$want.lock" > .venv/uv.req
  "${pip[@]}" install --quiet --disable-pip-version-check --require-hashes -r .venv/uv.req
  links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
  .venv/bin/uv pip sync --quiet --python .venv/bin/python ${links:+--find-links "$links"} "requirements/$want.lock"
  echo "$want" > .venv/.installed
fi
