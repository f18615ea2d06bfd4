"""The webhook benchmark's bound (``tests/benchmarks/webhook.py``): a view that stores
a delivery with one bare ``INSERT`` and nothing else: no signature checked, no
envelope read, no intake rules. The inbox's webhook view does all of that on top of
the same insert; the benchmark compares the two under the same server and load."""

import json

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

INSERT = """
INSERT INTO django_outbox_inbox
    (source, message_id, type, payload, headers, state, attempts, available_at,
     attempt_open, unclean_end, last_error, received_at, raw_body, traceback)
VALUES (%s, %s, %s, %s, '{}', 'should_be_handled', 0, now(), false, false, '', now(), '', '')
ON CONFLICT (source, message_id) DO NOTHING
"""


@csrf_exempt
def bare_insert(request: HttpRequest, source: str) -> JsonResponse:
    payload = json.loads(request.body)
    with connection.cursor() as cursor:
        cursor.execute(
            INSERT,
            [
                source,
                request.headers["outbox-message-id"],
                request.headers["outbox-type"],
                json.dumps(payload),
            ],
        )
    return JsonResponse({"status": "stored"})
