"""The broker connection's security for the one client that is not librdkafka: the join's
faust app (aiokafka). Every other client takes ``KafkaSettings.client_config()``'s
``security.protocol`` / ``sasl.*`` / ``ssl.*`` settings as they are; faust takes the same
settings as ``broker_credentials``:

* ``SSL``: an SSL context (CA, and the client certificate for mutual TLS);
* ``SASL_PLAINTEXT`` / ``SASL_SSL`` with PLAIN or SCRAM: ``faust.SASLCredentials``;
* OAUTHBEARER: ``faust.OAuthCredentials`` with a token provider doing the OIDC
  client-credentials grant against ``sasl_oauthbearer_token_endpoint_url`` (librdkafka's
  ``sasl.oauthbearer.method=oidc`` does the same for the other clients).
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.parse
import urllib.request
from typing import Any

import faust
from aiokafka.abc import AbstractTokenProvider

from streams.settings import KafkaSettings

__all__ = ["faust_credentials", "ssl_context"]


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """The TLS context of a connection to the brokers: their CA (else the system's), and the
    client certificate when mutual TLS is configured."""
    context = ssl.create_default_context(cafile=kafka.ssl_ca_location)
    if kafka.ssl_certificate_location:
        password = kafka.ssl_key_password.get_secret_value() if kafka.ssl_key_password else None
        context.load_cert_chain(kafka.ssl_certificate_location, keyfile=kafka.ssl_key_location, password=password)
    return context


def faust_credentials(kafka: KafkaSettings) -> Any:
    """faust's ``broker_credentials`` for these settings (None: plaintext)."""
    protocol = kafka.security_protocol or "PLAINTEXT"
    context = ssl_context(kafka) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    if kafka.sasl_mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=_ClientCredentialsTokens(kafka), ssl_context=context)
    return faust.SASLCredentials(
        username=kafka.sasl_username, password=kafka.sasl_password.get_secret_value(),
        mechanism=kafka.sasl_mechanism, ssl_context=context,
    )  # fmt: skip


class _ClientCredentialsTokens(AbstractTokenProvider):
    """aiokafka's OAUTHBEARER token provider: the OIDC client-credentials grant, the token
    kept until four fifths of its lifetime have passed."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._url = kafka.sasl_oauthbearer_token_endpoint_url
        self._client = (kafka.sasl_oauthbearer_client_id, kafka.sasl_oauthbearer_client_secret)
        self._scope = kafka.sasl_oauthbearer_scope
        self._token: str | None = None
        self._renew_at = 0.0

    def _fetch(self) -> str:
        client_id, secret = self._client
        form = {"grant_type": "client_credentials", **({"scope": self._scope} if self._scope else {})}
        basic = base64.b64encode(f"{client_id}:{secret.get_secret_value()}".encode()).decode()
        request = urllib.request.Request(self._url, urllib.parse.urlencode(form).encode(), {"Authorization": f"Basic {basic}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.load(response)
        self._token, self._renew_at = body["access_token"], time.time() + 0.8 * float(body.get("expires_in", 300))
        return self._token

    async def token(self) -> str:
        if self._token is None or time.time() >= self._renew_at:
            return await asyncio.get_running_loop().run_in_executor(None, self._fetch)
        return self._token
