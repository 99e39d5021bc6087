#!/usr/bin/env bash
# The system packages some tests drive, installed by setup-tests.sh: chromium (pack show's page in
# a real browser) and fuse3 (fusermount3, for the FUSE mount tests). Installed with apt-get when
# running as root and missing; where that cannot be done the run goes on and those tests skip,
# saying why.
set -uo pipefail
COMMANDS=(chromium fusermount3)
PACKAGES=(chromium fuse3)
missing=()
for i in "${!COMMANDS[@]}"; do
    command -v "${COMMANDS[$i]}" >/dev/null 2>&1 || missing+=("${PACKAGES[$i]}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test-packages: ${missing[*]} missing, and no apt-get as root here to install them: their tests skip" >&2
    exit 0
fi
APT=(apt-get -qq -o DPkg::Lock::Timeout=300)  # another apt run on the machine: wait for it
if ! { "${APT[@]}" update && DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y --no-install-recommends \
        "${missing[@]}"; } >/dev/null 2>&1; then
    echo "test-packages: apt-get could not install ${missing[*]}: their tests skip" >&2
fi
exit 0
