#!/usr/bin/env bash
# Make this x86_64 Debian host run arm64 programs (building and serving linux/arm64 images here):
# qemu's aarch64 emulator from Debian trixie, registered with binfmt_misc with the F flag (the
# kernel opens the emulator once, so containers, which lack the host's /usr, can use it too).
#
# Why trixie's (qemu 10.0) and not bookworm's qemu-user-static (7.2): 7.2 hands an arm64 program
# the host's x86 /proc/cpuinfo, and PyPI's aarch64 torch 2.13.0 then segfaults at import
# (measured: `import torch` in the arm64 stand-in, qemu 7.2: SIGSEGV right after reading the CPU
# topology; qemu 10.0.13: imports in 40 s). qemu emulates an arm64 /proc/cpuinfo since 8.1
# (linux-user/aarch64/target_proc.h, open_cpuinfo). trixie's qemu-user binaries are static, so the
# one file is taken out of the Debian package without installing it (bookworm keeps its own qemu).
# Safe to run again: it does only what is missing. Needs root.
set -euo pipefail
dest=/usr/local/lib/gemma4-images/qemu-aarch64
binfmt=/proc/sys/fs/binfmt_misc
min_major=8 min_minor=1

version() { "$1" --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1; }
new_enough() { read -r major minor <<<"$(version "$1")"; [ -n "${major:-}" ] && { [ "$major" -gt "$min_major" ] || { [ "$major" -eq "$min_major" ] && [ "$minor" -ge "$min_minor" ]; }; }; }

if ! { [ -x "$dest" ] && new_enough "$dest"; }; then
  echo "setup-emulation: fetching qemu-user from Debian trixie" >&2
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$tmp/trixie.list"
  apt=(-o Dir::Etc::sourcelist="$tmp/trixie.list" -o Dir::Etc::sourceparts=/nonexistent
       -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get update -qq "${apt[@]}"
  (cd "$tmp" && apt-get download -qq "${apt[@]}" qemu-user 2>/dev/null)
  dpkg-deb -x "$tmp"/qemu-user_*.deb "$tmp/root"
  install -D -m 0755 "$tmp/root/usr/bin/qemu-aarch64" "$dest"
  new_enough "$dest" || { echo "setup-emulation: $dest is not qemu >= $min_major.$min_minor" >&2; exit 1; }
fi

[ -f "$binfmt/status" ] || mount -t binfmt_misc binfmt_misc "$binfmt"
current=$(sed -n 's/^interpreter //p' "$binfmt/qemu-aarch64" 2>/dev/null || true)
if [ "$current" != "$dest" ] || ! grep -q '^flags: .*F' "$binfmt/qemu-aarch64"; then
  [ -f "$binfmt/qemu-aarch64" ] && echo -1 > "$binfmt/qemu-aarch64"   # another emulator (bookworm's 7.2)
  # The ELF header of an aarch64 executable, as Debian's qemu registers it (usr/share/qemu/binfmt.d).
  magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  echo ":qemu-aarch64:M::$magic:$mask:$dest:POCF" > "$binfmt/register"
fi
# Registered but switched off (`echo 0` to the entry, or to status for all of them): on again.
grep -qx enabled "$binfmt/qemu-aarch64" || echo 1 > "$binfmt/qemu-aarch64"
grep -qx enabled "$binfmt/status" || echo 1 > "$binfmt/status"
echo "setup-emulation: arm64 programs run through $dest ($("$dest" --version | head -1))" >&2
