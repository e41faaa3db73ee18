#!/usr/bin/env bash
# Installs the system programs streamtrain's local services need, only those missing:
# a JRE 17+ and Maven (Kafka from Maven Central), etcd (Debian etcd-server), Redis (redis-server).
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server etcd-client)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
  echo "missing: ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2; exit 1
fi
echo "installing: ${missing[*]}"
# The Debian packages would start system-wide etcd/redis daemons on the default ports; our
# services run on their own ports and data dirs, so forbid service starts during the install.
added_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  added_policy=1
fi
trap '[ -n "$added_policy" ] && $sudo rm -f /usr/sbin/policy-rc.d' EXIT
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
