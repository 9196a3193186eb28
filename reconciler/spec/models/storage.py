"""The Storage kind: a named object-storage remote that machines write a run's outputs to.

Checkpoints of a large model do not fit on the reconciler's host and should not cross it: with a
Storage, the machine uploads them itself (rclone) and the control plane only reads the listing.
A Storage names an rclone backend and its options in plain text, and its credentials by secret
name only; the values are resolved on the reconciler host at launch, like a run's secrets.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from .common import ENV_NAME, ENV_NAME_MESSAGE, Metadata, Strict

# rclone backends a Storage may name (rclone's own type names; "gcs" is the prefix rclone also
# accepts for "google cloud storage", https://rclone.org/googlecloudstorage/).
BACKENDS = ("s3", "gcs", "azureblob", "b2", "sftp", "swift")
OPTION = r"^[a-z][a-z0-9_]{0,63}$"
OPTION_MESSAGE = "an rclone option name: lowercase letters, digits and '_' (as in rclone's config file)"
# A bucket (or, for sftp, a folder) and a prefix: '/'-separated segments, no '..', nothing a shell,
# a URI or an rclone remote string would read differently (no ':', no spaces).
SEGMENTS = r"^[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*$"
SEGMENTS_MESSAGE = "'/'-separated names of letters, digits, '_', '.', '=', '+' and '-', without '..'"
BWLIMIT = r"^[0-9A-Za-z.:,|\- ]{0,200}$"

# Option names whose value rclone treats as a secret (each backend's documentation lists them as
# "sensitive": https://rclone.org/s3/#standard-options, /googlecloudstorage/, /azureblob/, /b2/,
# /sftp/, /swift/). They belong in credentials, which name a secret instead of holding it.
SECRET_OPTIONS = frozenset({
    "access_key_id", "secret_access_key", "session_token", "sse_customer_key", "sse_customer_key_base64",
    "service_account_credentials", "client_secret", "token", "access_token", "key", "account",
    "sas_url", "connection_string", "client_certificate_password", "password", "pass", "key_pem",
    "key_file_pass", "auth_token", "application_credential_secret",
})
_SECRET_WORDS = ("secret", "password", "pass", "token", "credentials", "pem", "sas")


def is_secret_option(name: str) -> bool:
    """Whether an rclone option carries a secret: one of the options rclone documents as
    sensitive, or a name made of a word that only secrets use."""
    return name in SECRET_OPTIONS or any(w in _SECRET_WORDS for w in name.split("_"))


class StorageSpec(Strict):
    """Where a run's checkpoints and artifacts go: an rclone remote, a bucket and a prefix."""

    backend: Literal[BACKENDS] = Field(description="rclone backend type: s3 (AWS, MinIO, R2, any S3 API), gcs "
                                       "(Google Cloud Storage), azureblob, b2, sftp or swift.", examples=["s3"])
    options: dict[Annotated[str, Field(pattern=OPTION)], str] = Field(
        default_factory=dict, description="Non-secret rclone options of the backend (provider, endpoint, region, "
        "...), as strings; secret ones (keys, passwords, tokens) go in credentials.",
        examples=[{"provider": "AWS", "region": "eu-west-1"}])
    credentials: dict[Annotated[str, Field(pattern=OPTION)],
                      Annotated[str, Field(pattern=ENV_NAME, json_schema_extra={
                          "patternErrorMessage": "a secret's name: " + ENV_NAME_MESSAGE})]] = Field(
        default_factory=dict, description="rclone option → the name of the secret holding its value, resolved on "
        "the reconciler host at launch (never a value).",
        examples=[{"access_key_id": "S3_KEY_ID", "secret_access_key": "S3_SECRET"}])
    bucket: str = Field(pattern=SEGMENTS, max_length=255, description="Bucket (sftp: folder) the outputs go to.",
                        examples=["training-outputs"], json_schema_extra={"patternErrorMessage": SEGMENTS_MESSAGE})
    prefix: str = Field("", max_length=255, description="Folder inside the bucket; runs go under "
                        "<prefix>/<repository id>/<run>/g<generation>.", examples=["team-nlp"],
                        json_schema_extra={"pattern": SEGMENTS.replace("^", "^$|^", 1),
                                           "patternErrorMessage": SEGMENTS_MESSAGE})
    keep_checkpoints: int = Field(2, ge=1, le=64, description="Complete checkpoints kept in the bucket per run "
                                  "generation (older ones are deleted by the machine).", examples=[2])
    interval_s: int = Field(30, ge=5, le=86400, description="Seconds between the machine's looks for new "
                            "checkpoints to upload.", examples=[30])
    bwlimit: str = Field("", pattern=BWLIMIT, description="rclone --bwlimit for uploads (empty: unlimited).",
                         examples=["50M"], json_schema_extra={"patternErrorMessage": "an rclone --bwlimit value "
                                                              "(50M, 10M:1M, '08:00,512k 12:00,10M')"})

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        return _segments(v)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        return v if v == "" else _segments(v)

    @model_validator(mode="after")
    def _secrets_apart(self):
        secret = sorted(k for k in self.options if is_secret_option(k))
        if secret:
            raise ValueError(f"options {', '.join(secret)}: rclone treats these as secrets; name a secret in "
                             f"credentials instead (credentials: {{{secret[0]}: SECRET_NAME}})")
        both = sorted(set(self.options) & set(self.credentials))
        if both:
            raise ValueError(f"{', '.join(both)} set in both options and credentials")
        return self


def _segments(v: str) -> str:
    if not re.fullmatch(SEGMENTS, v) or ".." in v.split("/") or "." in v.split("/"):
        raise ValueError(f"must be {SEGMENTS_MESSAGE}")
    return v


class Storage(Strict):
    """A named object-storage remote: runs that name it upload their outputs there from the machine."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Storage"] = Field(description="What this file describes: an object-storage remote for outputs.")
    metadata: Metadata = Field(description="The Storage's name (its file name): what runs name in "
                               "spec.outputs.storage, and the rclone remote name in status URIs.")
    spec: StorageSpec = Field(description="The rclone backend, its options, credentials by secret name, bucket "
                              "and prefix.")


__all__ = ["Storage", "StorageSpec", "BACKENDS", "is_secret_option", "ENV_NAME_MESSAGE"]
