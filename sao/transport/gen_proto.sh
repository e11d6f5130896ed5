#!/usr/bin/env bash
# Regenerates sao_pb2.py, sao_pb2.pyi and sao_pb2_grpc.py from sao.proto. Run from anywhere; needs grpcio-tools.
#
# protoc is run from the repository root with the proto's repo-relative path, so the generated gRPC module
# imports `from sao.transport import sao_pb2` (package-absolute) and the descriptor is registered under the unique
# name "sao/transport/sao.proto".
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. sao/transport/sao.proto
grep -q "^from sao.transport import sao_pb2 as" sao/transport/sao_pb2_grpc.py || {
  echo "gen_proto.sh: unexpected import in sao_pb2_grpc.py" >&2; exit 1; }
echo "generated with $(python -m grpc_tools.protoc --version); needs protobuf runtime >= $(
  sed -n 's/^# Protobuf Python Version: //p' sao/transport/sao_pb2.py)"
