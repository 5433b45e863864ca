"""Build the provider a config asks for (`spot:` section), and name this machine's hosts."""
from __future__ import annotations

import socket
from pathlib import Path

from transientvod.config import SpotConfig
from transientvod.spot.providers.provider import ProviderError, SpotProvider


def local_host_names() -> list[str]:
    """Names that Horovod treats as distinct hosts but that all run here without ssh:
    localhost, 127.0.0.1, and every other name that /etc/hosts maps to a loopback address."""
    names = ["localhost", "127.0.0.1"]
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[0] == "127.0.0.1":
            names += [name for name in fields[1:] if name not in names]
    hostname = socket.gethostname()
    try:
        if hostname not in names and socket.gethostbyname(hostname) == "127.0.0.1":
            names.append(hostname)
    except OSError:
        pass
    return names


def provider_from_config(spot: SpotConfig, start_time: float) -> SpotProvider:
    if spot.provider == "trace":
        from transientvod.spot.providers.trace import TraceProvider, load_trace, select_run, shipped_trace

        path = Path(spot.trace)
        if not path.exists() and path.name == spot.trace:
            path = shipped_trace(spot.trace)
        run = select_run(load_trace(path), spot.trace_run)
        hosts = [h.strip() for h in spot.hosts.split(",") if h.strip()] or local_host_names()
        # Skipping `start_at` trace seconds = starting the clock that much earlier.
        return TraceProvider(run, hosts, start_time=start_time - spot.start_at / spot.time_scale,
                             time_scale=spot.time_scale, notice_seconds=spot.notice_seconds,
                             slots=1, notices=spot.notices)
    if spot.provider == "aws":
        from transientvod.spot.providers.aws import AwsProvider

        return AwsProvider(job_tag=spot.job_tag, region=spot.region or None, endpoint_url=spot.endpoint_url or None,
                           queue_url=spot.queue_url or None, host_name=spot.host_name, slots=spot.slots)
    if spot.provider == "gce":
        from transientvod.spot.providers.gce import GceProvider

        return GceProvider(job_label=spot.job_label, project=spot.project, zone=spot.zone,
                           endpoint_url=spot.endpoint_url, host_name=spot.host_name, slots=spot.slots)
    raise ProviderError(f"spot.provider is {spot.provider!r}; there is no provider to build (use trace, aws or gce).")
