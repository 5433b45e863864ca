"""AWS EC2 spot notices from the instance-metadata service (IMDSv2, or IMDSv1 where the token's
reply cannot arrive): the instance-action and the rebalance recommendation."""
from __future__ import annotations

import json
import logging
import time

from transientvod.spot.notices.source import (NoAnswerError, Notice, NoticeSource, NoticeSourceError, fetch,
                                             unix_time)

log = logging.getLogger(__name__)

# IMDSv2 tokens live at most six hours; ask for the longest so a worker rarely asks again.
IMDS_TOKEN_TTL_SECONDS = 21600
# Ask for a new token this long before the old one expires, so a poll never carries a
# token that dies in flight.
IMDS_TOKEN_REFRESH_MARGIN_SECONDS = 60.0
# Every action an AWS instance-action can carry; anything else is not an instance-action.
AWS_ACTIONS = ("terminate", "stop", "hibernate")


HOP_LIMIT_FIX = "aws ec2 modify-instance-metadata-options --instance-id <id> --http-put-response-hop-limit 2"


class Imdsv2NoticeSource(NoticeSource):
    """AWS EC2 spot: the instance-action (terminate/stop two minutes ahead, hibernate at
    once) and the rebalance recommendation (an elevated risk of interruption, no time given),
    read from the instance-metadata service with an IMDSv2 session token, or without one
    (IMDSv1) when the token's reply cannot reach this process and the instance allows it."""

    name = "aws"
    ENDPOINT = "the EC2 instance-metadata service"

    def __init__(self, base_url: str = "http://169.254.169.254", timeout: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None
        self._token_expires_at = 0.0
        self.protocol: str | None = None  # "v2" | "v1", once prepare() found out

    def prepare(self) -> None:
        """IMDSv2 if a token comes back. The metadata service sends the token's reply with the
        instance's hop limit as its IP TTL: with the default of 1, a container behind a bridge
        never receives it and the PUT times out. Then, as AWS's node termination handler
        does, read without a token (IMDSv1) if the instance still allows that."""
        self._token = None
        try:
            self._session_token()
            self.protocol = "v2"
            return
        except NoticeSourceError as e:
            token_failure = e
        status, _ = self._plain_get("/latest/meta-data/instance-id")  # unreachable: that sentence
        if status == 200:
            self.protocol = "v1"
            log.info("%s gave no IMDSv2 token (%s); reading notices with IMDSv1 instead.", self.ENDPOINT,
                     str(token_failure).rstrip("."))
            return
        if isinstance(token_failure, NoAnswerError):
            raise NoticeSourceError(
                f"{self.ENDPOINT} at {self.base_url} sent no IMDSv2 token within {self.timeout:g} s (the hop limit "
                f"drops it inside a container) and refuses IMDSv1 (HTTP {status}), so this worker will hear no "
                f"notice; run `{HOP_LIMIT_FIX}`.")
        raise NoticeSourceError(
            f"{self.ENDPOINT} at {self.base_url} gave no IMDSv2 token and refuses IMDSv1 (HTTP {status}), so this "
            "worker will hear no notice; enable the instance's metadata service with IMDSv2.")

    def check(self) -> Notice | None:
        if self.protocol is None:
            self.prepare()
        # A termination says when the server goes; a rebalance only warns. Ask for the one
        # that says more first.
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            return self._instance_action(body)
        if status != 404:
            raise self._unexpected(status, "/latest/meta-data/spot/instance-action")
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            return Notice(source=self.name, action="rebalance", seen_at=time.time(), terminate_at=None)
        if status != 404:
            raise self._unexpected(status, "/latest/meta-data/events/recommendations/rebalance")
        return None

    def _instance_action(self, body: bytes) -> Notice:
        try:
            answer = json.loads(body)
            action = answer["action"]
        except (ValueError, TypeError, KeyError):
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered the spot instance-action "
                                    f"with {body[:80]!r}, not JSON with an action.") from None
        if action not in AWS_ACTIONS:
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered the spot instance-action "
                                    f"with action {action!r}, not one of {', '.join(AWS_ACTIONS)}.")
        seen_at = time.time()
        terminate_at = unix_time(answer.get("time"))
        if terminate_at is None:
            log.warning("%s gave the %s notice the time %r, which is not an ISO 8601 time; the server may go "
                        "at any moment.", self.ENDPOINT, action, str(answer.get("time"))[:40])
        if action == "hibernate":
            # Hibernation starts with the notice: there are no two minutes to spend.
            terminate_at = seen_at if terminate_at is None else min(terminate_at, seen_at)
        return Notice(source=self.name, action=action, seen_at=seen_at, terminate_at=terminate_at)

    def _get(self, path: str) -> tuple[int, bytes]:
        """GET as prepare() decided. With a token, a 401 means it expired or the service
        restarted: ask for a new one and try once more. Without one, a 401 means the instance
        now requires IMDSv2: find out again how to read it."""
        if self.protocol == "v1":
            status, body = self._plain_get(path)
            if status != 401:
                return status, body
            self.prepare()
            if self.protocol == "v1":
                return self._plain_get(path)
        status, body, _ = fetch("GET", self.base_url + path, {"X-aws-ec2-metadata-token": self._session_token()},
                                 self.timeout, self.ENDPOINT)
        if status == 401:
            self._token = None
            status, body, _ = fetch("GET", self.base_url + path,
                                     {"X-aws-ec2-metadata-token": self._session_token()}, self.timeout, self.ENDPOINT)
            if status == 401:
                raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} refused a token it had just issued; "
                                        "check that nothing else answers on that address.")
        return status, body

    def _plain_get(self, path: str) -> tuple[int, bytes]:
        status, body, _ = fetch("GET", self.base_url + path, {}, self.timeout, self.ENDPOINT)
        return status, body

    def _session_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires_at - IMDS_TOKEN_REFRESH_MARGIN_SECONDS:
            return self._token
        url = self.base_url + "/latest/api/token"
        status, body, _ = fetch("PUT", url, {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)},
                                 self.timeout, self.ENDPOINT)
        if status != 200 or not body.strip():
            raise NoticeSourceError(f"{self.ENDPOINT} at {url} gave no session token (HTTP {status}); "
                                    f"enable IMDSv2 on the instance, with `{HOP_LIMIT_FIX}` inside containers.")
        self._token = body.decode("ascii", "replace").strip()
        self._token_expires_at = time.monotonic() + IMDS_TOKEN_TTL_SECONDS
        return self._token

    def _unexpected(self, status: int, path: str) -> NoticeSourceError:
        return NoticeSourceError(f"{self.ENDPOINT} at {self.base_url}{path} answered HTTP {status}, "
                                 "neither a notice (200) nor none (404).")


