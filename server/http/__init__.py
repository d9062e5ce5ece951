"""The listeners: where a request enters.

``asgi`` holds the raw-ASGI helpers; ``routes`` the raw listeners' route tables (inference,
metrics), from which both their dispatch and their OpenAPI documents come; ``inference`` and
``kserve_v1`` the data plane; ``management`` (keys, readiness, description) with
``model_routes`` (the model routes, adapters over ``plane.management``) the control plane, each
FastAPI route declaring its statuses; ``openapi`` the shared schemas and the document
generator; ``auth`` the API keys, ``limits`` the HTTP/1.1 protocol limits,
``listeners``/``combined``/``apps`` bind sockets and build each port's app. Calls go down into
``plane`` and ``serving`` (registry, model version) and out to ``observe``; nothing below
imports http.
"""
