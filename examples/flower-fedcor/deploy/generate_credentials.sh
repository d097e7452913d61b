#!/usr/bin/env bash
# Credentials for a local Flower deployment with TLS and SuperNode authentication:
#   ca.crt, ca.key               a certificate authority made for this deployment only
#   server.pem, server.key       the SuperLink's TLS certificate (signed by that CA) for localhost,
#                                127.0.0.1 and ::1, plus any names in $EXTRA_SAN
#   supernode-I, supernode-I.pub an EC (NIST P-384) key pair per SuperNode I = 0..N-1, in OpenSSH
#                                format: the SuperNode signs with the private key, the SuperLink
#                                accepts it once its public key is registered (flwr supernode register)
#   supernode-I-tls.pem, .key    SuperNode I's own TLS certificate (signed by the CA, for localhost)
#                                for its Runtime API: no SuperNode holds server.key
#   supernode-I.secret           the SuperExec secret SuperNode I shares with its SuperExec only
#   superlink.secret             the SuperExec secret of the SuperLink and its ServerApp SuperExec
#
# Usage: bash examples/flower-fedcor/deploy/generate_credentials.sh [N] [DIR]
#   N    number of SuperNode key pairs (default 5)
#   DIR  where to write (default: the credentials/ folder next to this script; it is gitignored)
#   EXTRA_SAN="DNS:link.example.org,IP:10.0.0.5"  more names for the server certificate, for
#   SuperNodes that reach the SuperLink under another name than localhost
# Files that exist are kept (run it again with a larger N to add key pairs); delete DIR to start
# over. Needs openssl, and ssh-keygen or Python's cryptography package (a dependency of flwr).
# These are test credentials for one machine: a real federation's CA key stays off the SuperLink.
set -euo pipefail

N="${1:-5}"
DIR="${2:-"$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/credentials"}"
if ! [[ "$N" =~ ^[0-9]+$ ]] || [[ "$N" -lt 1 ]]; then
    echo "generate_credentials.sh: N must be a positive integer, got '$N'" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "generate_credentials.sh: openssl is not installed" >&2; exit 1; }

umask 077
mkdir -p "$DIR"
cd "$DIR"

if [[ ! -s ca.crt || ! -s ca.key ]]; then
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -days 365 \
        -keyout ca.key -out ca.crt -subj "/CN=fedselect local deployment CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" 2>/dev/null
    rm -f server.pem server.key  # a new CA needs a new server certificate
    echo "wrote $DIR/ca.crt, ca.key"
fi

ext="$(mktemp)"
trap 'rm -f "$ext"' EXIT
# server_cert NAME CN: NAME.pem and NAME.key, a TLS server certificate signed by the CA
server_cert() {
    local name=$1 cn=$2 san="DNS:localhost,IP:127.0.0.1,IP:::1${EXTRA_SAN:+,$EXTRA_SAN}"
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 \
        -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn" 2>/dev/null
    cat >"$ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
EOF
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
        -sha256 -days 365 -extfile "$ext" -out "$name.pem" 2>/dev/null
    rm -f "$name.csr"
    openssl verify -CAfile ca.crt "$name.pem" >/dev/null
}

if [[ ! -s server.pem || ! -s server.key ]]; then
    server_cert server localhost
    echo "wrote $DIR/server.pem, server.key (subjectAltName DNS:localhost,IP:127.0.0.1,IP:::1${EXTRA_SAN:+,$EXTRA_SAN})"
fi
[[ -s superlink.secret ]] || openssl rand 32 >superlink.secret

new=0
for ((i = 0; i < N; i++)); do
    key="supernode-$i"
    [[ -s "$key" && -s "$key.pub" ]] && continue
    rm -f "$key" "$key.pub"
    if command -v ssh-keygen >/dev/null; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedselect-$key" -f "$key"
    else
        python3 - "$key" <<'PY'
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

path = sys.argv[1]
key = ec.generate_private_key(ec.SECP384R1())
with open(path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption()))
with open(path + ".pub", "wb") as f:
    f.write(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            + b" fedselect-" + path.encode() + b"\n")
PY
    fi
    new=$((new + 1))
done
for ((i = 0; i < N; i++)); do   # each SuperNode's own TLS certificate and SuperExec secret
    [[ -s "supernode-$i-tls.pem" && -s "supernode-$i-tls.key" ]] || server_cert "supernode-$i-tls" "supernode-$i"
    [[ -s "supernode-$i.secret" ]] || openssl rand 32 >"supernode-$i.secret"
done
chmod 600 ./*.key ./*.secret supernode-* 2>/dev/null || true
chmod 644 ca.crt ./*.pem ./*.pub
echo "SuperNode key pairs in $DIR: supernode-0 .. supernode-$((N - 1)) ($new new)"
