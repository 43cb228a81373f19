"""The OpenAI-compatible LLM gateway: a proxy in front of vLLM that records every call as a span.

Run it with ``python -m collectors.gateway``. Recorded calls go through a disk spill to Kafka, so a
call recorded is never lost while Kafka is away.

routes      the HTTP surface: URLs, tenant and admin auth, pause/resume/state, health
proxy       ``Gateway``: relays calls to the vLLM upstreams, whole or streamed, pause and in-flight count
replies     OpenAI-shaped error answers; a request's JSON body read under the size limit
recording   what a call becomes: the upstream request, the client's answer, the recorded calls
spans       a recorded call as an OTLP span record
auth        bearer tokens: the caller's tenant, the admin token
spill       the disk spill in front of Kafka
serve       the app on a socket with its spill and Kafka producer; clean stop
"""
