"""One instance's metadata service, for a testbed host that plays an EC2 instance moto launched:
the one part of EC2 that cannot exist on this machine (the instance itself asks it, at
169.254.169.254, with no credentials). It answers what the instance's programs ask:

- /latest/meta-data/instance-id: the moto instance's id;
- /latest/meta-data/tags/instance/<key>: the instance's tag, read from moto at every request
  (the watchdog's heartbeat, which the fleet writes with CreateTags);
- /latest/meta-data/spot/instance-action: the file <notices dir>/<id>, once the EC2 stand-in
  (ec2_stand_in.py) has written EC2's two-minute warning there; 404 before, as EC2 answers;
- anything else: 404 (no rebalance recommendation).

IMDSv2 tokens as fake_imds_tags.py hands them out. Runs as a program inside the host's network
namespace: `python imds_ec2.py --address 169.254.169.254 --port 80 --instance-id ID --endpoint
URL --region R --notices-dir DIR`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).parent))
from fake_imds_tags import TAGS_PATH, metadata_server  # noqa: E402

INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"


def ec2_lookup(instance_id: str, ec2, notices_dir: Path):
    def lookup(path: str) -> str | None:
        if path == INSTANCE_ID_PATH:
            return instance_id
        if path == INSTANCE_ACTION_PATH:
            action = notices_dir / instance_id
            return action.read_text() if action.is_file() else None
        if path.startswith(TAGS_PATH):
            key = path[len(TAGS_PATH):]
            tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]},
                                              {"Name": "key", "Values": [key]}])["Tags"]
            return tags[0]["Value"] if tags else None
        return None
    return lookup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--notices-dir", type=Path, required=True)
    args = parser.parse_args()
    ec2 = boto3.client("ec2", region_name=args.region, endpoint_url=args.endpoint)
    server = metadata_server(args.address, args.port, ec2_lookup(args.instance_id, ec2, args.notices_dir))
    print(f"serving http://{args.address}:{args.port} for {args.instance_id}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
