#!/usr/bin/env bash
# Makes the certificates gpupool's components serve and present, for a
# cluster without cert-manager (deploy/README.md, "Certificates"), signed by
# a CA of gpupool's own, as components/cert-manager issues them:
#
#   ca.crt, ca.key                        the CA (10 years); kept when it exists,
#                                         so that a renewal keeps every caBundle
#   gpupool-allocator.{crt,key}           serving, gpupool-allocator.gpupool.svc and
#                                         each replica of overlays/etcd
#   gpupool-adapter.{crt,key}             serving, gpupool-adapter.gpupool.svc
#   gpupool-webhook.{crt,key}             serving, gpupool-webhook.gpupool.svc
#   gpupool-keda-client.{crt,key}         client, KEDA's, for the adapter's
#                                         external scaler (--keda-client-ca)
#
# Usage: deploy/certs.sh DIR      (DAYS=365 sets the leaves' lifetime)
set -euo pipefail
dir="${1:?usage: deploy/certs.sh DIR}"
days="${DAYS:-365}"
mkdir -p "$dir"
cd "$dir"
umask 077

key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"
}

if [ ! -f ca.crt ] || [ ! -f ca.key ]; then
  key ca
  openssl req -x509 -new -key ca.key -days 3650 -subj /CN=gpupool-ca -out ca.crt \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
fi

# issue NAME CN EXTENSIONS: a leaf NAME.crt for CN, signed by the CA.
issue() {
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
    -days "$days" -out "$1.crt" -extfile <(printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n%s\n' "$3")
  rm "$1.csr"
}

# The allocator's clients send bearer tokens: they reach its Service, or
# each replica of overlays/etcd by its own name under gpupool-allocator-peers.
issue gpupool-allocator gpupool-allocator.gpupool.svc \
  "extendedKeyUsage=serverAuth
subjectAltName=DNS:gpupool-allocator.gpupool.svc,DNS:gpupool-allocator.gpupool.svc.cluster.local,DNS:*.gpupool-allocator-peers.gpupool.svc,DNS:*.gpupool-allocator-peers.gpupool.svc.cluster.local"
for service in gpupool-adapter gpupool-webhook; do
  issue "$service" "$service.gpupool.svc" \
    "extendedKeyUsage=serverAuth
subjectAltName=DNS:$service.gpupool.svc,DNS:$service.gpupool.svc.cluster.local"
done
# KEDA presents it to the adapter's external scaler, which trusts this CA.
issue gpupool-keda-client keda "extendedKeyUsage=clientAuth"
chmod 644 ./*.crt
echo "certificates in $PWD" >&2
