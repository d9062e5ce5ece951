"""The listeners: where a request enters.

``asgi`` holds the raw-ASGI helpers, ``inference``/``kserve_v1`` the data plane, ``management``
and ``openapi`` the control plane, ``auth`` the API keys, ``limits`` the HTTP/1.1 protocol limits,
``listeners``/``combined``/``apps`` bind sockets and build each port's app. Calls go down into
``serving`` (registry, model version) and out to ``observe``; nothing below imports http.
"""
