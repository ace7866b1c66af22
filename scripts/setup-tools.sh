#!/usr/bin/env bash
# Install the supply-chain binaries requirements/trixie-tools.lock pins (cosign, oras) into
# /usr/local/lib/gemma4-images/bin (GEMMA4_TOOLS_DIR elsewhere): each is one static file taken out of its Debian trixie
# package, whose sha256 must be the lock's (bookworm has neither). Air-gapped: put the .deb files
# in a folder and set GEMMA4_DEB_MIRROR to it; nothing is downloaded then. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${GEMMA4_TOOLS_DIR:-/usr/local/lib/gemma4-images/bin}
arch=$(dpkg --print-architecture)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fetched=
while read -r package version deb_arch sha256 path; do
  case "$package" in ''|'#'*) continue ;; esac
  [ "$deb_arch" = "$arch" ] || continue
  stamp="$dest/.$package-$version"
  [ -x "$dest/$(basename "$path")" ] && [ -f "$stamp" ] && continue
  deb="${package}_${version//:/%3a}_${arch}.deb"
  if [ -n "${GEMMA4_DEB_MIRROR:-}" ]; then
    [ -f "$GEMMA4_DEB_MIRROR/$deb" ] || { echo "setup-tools: no $deb in GEMMA4_DEB_MIRROR ($GEMMA4_DEB_MIRROR)" >&2; exit 1; }
    cp "$GEMMA4_DEB_MIRROR/$deb" "$tmp/"
  else
    if [ -z "$fetched" ]; then
      mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
      echo "deb http://deb.debian.org/debian trixie main" > "$tmp/trixie.list"
      apt=(-o Dir::Etc::sourcelist="$tmp/trixie.list" -o Dir::Etc::sourceparts=/nonexistent
           -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
      apt-get update -qq "${apt[@]}"
      fetched=1
    fi
    echo "setup-tools: fetching $package $version from Debian trixie" >&2
    (cd "$tmp" && apt-get download -qq "${apt[@]}" "$package=$version" 2>/dev/null)
  fi
  got=$(sha256sum "$tmp/$deb" | cut -d' ' -f1)
  [ "$got" = "$sha256" ] || { echo "setup-tools: $deb has sha256 $got, not the lock's $sha256" >&2; exit 1; }
  dpkg-deb -x "$tmp/$deb" "$tmp/root-$package"
  install -D -m 0755 "$tmp/root-$package/$path" "$dest/$(basename "$path")"
  rm -f "$dest/.$package-"*; touch "$stamp"
  echo "setup-tools: $dest/$(basename "$path") from $package $version" >&2
done < requirements/trixie-tools.lock
