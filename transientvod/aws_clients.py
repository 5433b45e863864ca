"""boto3 clients made one way, and the one-sentence errors their calls end in.

The watcher (spot/providers/aws.py), the fleet (spot/provisioning/fleet.py), the spot price history
(billing/prices.py) and the S3 checkpoint store (checkpoint/s3.py) all talk to AWS. Here, and only here, a client gets its timeouts, its
retries, its region and the user's endpoint URL, and a botocore exception becomes a sentence
naming the thing to fix. The callers wrap that sentence in their own error type
(ProviderError, PriceError), so this module sits below both spot/ and billing/ and imports
neither; it lives at the top of the package for that reason, not in spot/ (billing must not
import spot: the fleet imports billing).

Credentials are not looked up when a client is made: boto3 does that at the first call (an
instance role may take a metadata round trip), and a missing one then reads
"no AWS credentials found; ...", like every other error here.
"""
from __future__ import annotations

from xml.etree import ElementTree

import boto3
import botocore.exceptions
from botocore.config import Config

# The callers poll or bill from a loop: a call that hangs or retries for a minute stalls the
# loop, so connect fast and let the next poll retry rather than retrying long here.
CONNECT_TIMEOUT_SECONDS = 3
READ_TIMEOUT_SECONDS = 10
MAX_ATTEMPTS = 3  # per call, the first attempt included

ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
                                 "UnauthorizedAccess", "AuthorizationError"})
CREDENTIALS_REJECTED_CODES = frozenset({"AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch",
                                        "UnrecognizedClientException", "ExpiredToken", "ExpiredTokenException",
                                        "RequestExpired", "InvalidAccessKeyId"})
NO_CREDENTIALS = ("no AWS credentials found; configure them (aws configure, environment variables, "
                  "or an instance role).")


def client_config(read_timeout: float = READ_TIMEOUT_SECONDS, attempts: int = MAX_ATTEMPTS,
                  connect_timeout: float = CONNECT_TIMEOUT_SECONDS, path_style: bool = False) -> Config:
    """Timeouts and botocore's "standard" retries (which back off on throttling). `attempts`
    counts the first one too (botocore's total_max_attempts; its "max_attempts" would count only
    the retries). `path_style`: S3 addressing for S3-compatible servers (MinIO, Ceph, moto),
    which rarely resolve bucket subdomains of their own host name."""
    return Config(connect_timeout=connect_timeout, read_timeout=read_timeout,
                  retries={"total_max_attempts": attempts, "mode": "standard"},
                  s3={"addressing_style": "path"} if path_style else None)


def aws_client(service: str, region: str | None = None, endpoint_url: str | None = None, session=None,
               read_timeout: float = READ_TIMEOUT_SECONDS, attempts: int = MAX_ATTEMPTS,
               connect_timeout: float = CONNECT_TIMEOUT_SECONDS):
    """A boto3 client of `service` in `region` (None: the session's, from AWS_DEFAULT_REGION or
    ~/.aws/config), at `endpoint_url` (None: AWS's, or AWS_ENDPOINT_URL). `session` defaults to a
    new one, since boto3's default session is not safe to share across threads; tests pass theirs
    to count or watch the calls. An S3 client at an explicit endpoint addresses buckets by path.
    Raises botocore's exceptions (NoRegionError, ProfileNotFound): the caller turns them into its
    error with aws_error_sentence."""
    session = session or boto3.session.Session(region_name=region)
    config = client_config(read_timeout, attempts, connect_timeout, path_style=service == "s3" and bool(endpoint_url))
    return session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)


def error_details(error: botocore.exceptions.ClientError) -> tuple[str | None, str]:
    """(code, message) of an AWS error answer. An endpoint that answers a JSON-protocol call
    (SQS, EventBridge) with an XML error body, as moto does when it enforces IAM and as some
    proxies do, leaves botocore with the HTTP status as the code and the raw XML as the
    message: the code and message are read from that XML then, so the error still says what
    it is (AccessDenied) instead of pasting markup into the sentence."""
    details = error.response.get("Error", {})
    code, message = details.get("Code"), details.get("Message") or ""
    if str(code).isdigit() and message.lstrip().startswith("<"):
        try:
            root = ElementTree.fromstring(message.strip())
        except ElementTree.ParseError:
            return code, f"HTTP {code} with a body that is not an AWS error"
        found = {element.tag.rsplit("}", 1)[-1]: (element.text or "") for element in root.iter()}
        return found.get("Code") or code, found.get("Message", "")
    return code, message


def client_error_codes(error: botocore.exceptions.ClientError) -> set:
    details = error.response.get("Error", {})
    return {details.get("Code"), details.get("QueryErrorCode"), error_details(error)[0]}


def aws_error_sentence(error: Exception, call: str, region: str | None, whose: str) -> str:
    """One sentence for a botocore exception raised by `call`; `whose` names the identity to
    grant permissions to ("the watcher's", "the fleet's"). Callers add their own cases first
    (a missing queue, a missing image)."""
    e = error
    if isinstance(e, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)):
        return NO_CREDENTIALS
    if isinstance(e, botocore.exceptions.NoRegionError):
        return "no AWS region set; pass a region or set AWS_DEFAULT_REGION."
    if isinstance(e, botocore.exceptions.ProfileNotFound):
        return (f"AWS profile {e.kwargs.get('profile')!r} does not exist; "
                "fix AWS_PROFILE or add the profile to ~/.aws/config.")
    if isinstance(e, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                      botocore.exceptions.ConnectionClosedError)):
        return (f"cannot reach the AWS endpoint {e.kwargs.get('endpoint_url', '?')} (region {region}) "
                f"for {call}; check the endpoint URL, the region and the network.")
    if isinstance(e, botocore.exceptions.ReadTimeoutError):
        return (f"the AWS endpoint {e.kwargs.get('endpoint_url', '?')} did not answer {call} in time; "
                "check the network (the next poll tries again).")
    if isinstance(e, botocore.exceptions.ClientError):
        code, message = error_details(e)
        codes = client_error_codes(e)
        if codes & ACCESS_DENIED_CODES:
            return f"AWS denied {call} to these credentials; grant that permission to {whose} user or role."
        if codes & CREDENTIALS_REJECTED_CODES:
            return (f"AWS rejected the credentials for {call} ({code}); "
                    "check or refresh them (aws configure, environment variables, or an instance role).")
        # One line, whatever the server sent.
        message = " ".join(message.split()).rstrip(".") or "no message"
        return f"AWS answered {call} with {code}: {message}."
    return f"the AWS call {call} failed ({e})."
