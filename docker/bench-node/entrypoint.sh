#!/bin/sh
# rackbench bench-node entrypoint.
#
# Installs the campaign's SSH keys from the read-only key mount, writes an sshd and an ssh client
# configuration that use them, then execs sshd in the foreground (or the command given as arguments).
# No key is in the image: every key comes from the key directory at start, and the host key is either the
# campaign's or generated here, never at build time.
#
# Key directory (RACKBENCH_KEYS_DIR, default /rackbench-keys):
#   authorized_keys        required
#   id_ed25519             optional: private key for ssh to the other containers (mpirun)
#   ssh_host_ed25519_key   optional: this container's host key (generated when absent)
#   known_hosts            optional: the other containers' host keys -> StrictHostKeyChecking yes
#   hosts                  optional, without known_hosts: the only hosts accepted on first contact
#                          (accept-new); any other host is refused
# With neither known_hosts nor hosts, every host is accepted on first contact and pinned afterwards.
#
# Every path can be moved with an environment variable so that the script can be tested outside a
# container: RACKBENCH_SSH_STATE_DIR, RACKBENCH_SSH_CLIENT_CONFIG, RACKBENCH_SSHD.
set -eu

port="${RACKBENCH_SSH_PORT:-2222}"
keys="${RACKBENCH_KEYS_DIR:-/rackbench-keys}"
state="${RACKBENCH_SSH_STATE_DIR:-/run/rackbench-ssh}"
client_config="${RACKBENCH_SSH_CLIENT_CONFIG:-/etc/ssh/ssh_config}"
sshd="${RACKBENCH_SSHD:-/usr/sbin/sshd}"

die() {
    echo "rackbench-entrypoint: $*" >&2
    exit 1
}

case "$port" in
'' | *[!0-9]*) die "RACKBENCH_SSH_PORT must be a port number, got '$port'" ;;
esac
[ "${#port}" -le 5 ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "RACKBENCH_SSH_PORT must be 1 to 65535, got $port"
[ -r "$keys/authorized_keys" ] || die "$keys/authorized_keys is missing: mount the campaign's key directory at $keys"

umask 077
mkdir -p "$state"
chmod 700 "$state"
user=$(id -un 2>/dev/null || true)

# sshd's StrictModes wants these owned by the login user and private: copy them out of the mount.
cp "$keys/authorized_keys" "$state/authorized_keys"
chmod 600 "$state/authorized_keys"

if [ -r "$keys/ssh_host_ed25519_key" ]; then
    cp "$keys/ssh_host_ed25519_key" "$state/ssh_host_ed25519_key"
elif [ ! -s "$state/ssh_host_ed25519_key" ]; then
    rm -f "$state/ssh_host_ed25519_key" "$state/ssh_host_ed25519_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "rackbench-$(hostname 2>/dev/null || echo container)" \
        -f "$state/ssh_host_ed25519_key" > /dev/null
fi
chmod 600 "$state/ssh_host_ed25519_key"

identity=""
if [ -r "$keys/id_ed25519" ]; then
    cp "$keys/id_ed25519" "$state/id_ed25519"
    chmod 600 "$state/id_ed25519"
    identity="$state/id_ed25519"
fi

first_contact=""
if [ -r "$keys/known_hosts" ]; then
    cp "$keys/known_hosts" "$state/known_hosts"
    checking=yes
else
    : >> "$state/known_hosts"
    checking=accept-new
    if [ -r "$keys/hosts" ]; then
        checking=yes
        set -f
        for host in $(cat "$keys/hosts"); do
            case "$host" in
            *[!A-Za-z0-9._:-]*) die "$keys/hosts: '$host' is not a host name or address" ;;
            esac
            first_contact="$first_contact $host"
        done
        set +f
    fi
fi
chmod 600 "$state/known_hosts"

{
    echo "# Written by rackbench-entrypoint: ssh between the campaign's containers."
    if [ -n "$first_contact" ]; then
        echo "Host$first_contact"
        echo "    StrictHostKeyChecking accept-new"
    fi
    echo "Host *"
    echo "    Port $port"
    if [ -n "$identity" ]; then
        echo "    IdentityFile $identity"
        echo "    IdentitiesOnly yes"
    fi
    echo "    BatchMode yes"
    echo "    UserKnownHostsFile $state/known_hosts"
    echo "    StrictHostKeyChecking $checking"
} > "$state/ssh_config"
chmod 644 "$state/ssh_config"

# The system client configuration includes ours first (the image does it at build time for the default
# path; a read-only /etc then needs nothing). First obtained value wins in ssh_config, so it goes on top.
include="Include $state/ssh_config"
if ! grep -qxF "$include" "$client_config" 2> /dev/null; then
    if [ -w "$client_config" ] || { [ ! -e "$client_config" ] && [ -w "$(dirname "$client_config")" ]; }; then
        { echo "$include"; cat "$client_config" 2> /dev/null || true; } > "$state/ssh_config.system"
        cat "$state/ssh_config.system" > "$client_config"
        rm -f "$state/ssh_config.system"
        chmod go+r "$client_config" 2> /dev/null || true
    else
        echo "rackbench-entrypoint: cannot write $client_config; ssh here needs -F $state/ssh_config" >&2
    fi
fi

{
    echo "# Written by rackbench-entrypoint: key-only logins for the campaign's key."
    echo "HostKey $state/ssh_host_ed25519_key"
    echo "PidFile $state/sshd.pid"
    echo "AuthorizedKeysFile $state/authorized_keys"
    [ -z "$user" ] || echo "AllowUsers $user"
    echo "PermitRootLogin prohibit-password"
    echo "PubkeyAuthentication yes"
    echo "PasswordAuthentication no"
    echo "ChallengeResponseAuthentication no"
    echo "UsePAM no"
    echo "StrictModes yes"
    echo "PermitUserEnvironment no"
    echo "X11Forwarding no"
    echo "AllowAgentForwarding no"
    echo "PrintMotd no"
} > "$state/sshd_config"

if [ "$#" -gt 0 ]; then
    exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
    mkdir -p /run/sshd # privilege separation directory, normally made by the init system
    chmod 755 /run/sshd
fi
exec "$sshd" -D -e -f "$state/sshd_config" -p "$port"
