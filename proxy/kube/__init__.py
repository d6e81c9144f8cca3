"""The Kubernetes list/watch protocol vocabulary: plain synchronous code, no I/O.

One concept per module, each reproducing kube-apiserver's behaviour and texts:
``payloads`` (raw JSON shapes), ``status`` (Status errors), ``field_errors`` (422 causes),
``resources`` (GVRs and request paths), ``versions`` (resourceVersion rules),
``selectors`` / ``labelsyntax`` (label and field selectors), ``options`` (ListOptions
decoding, validation and semantics) and ``gocompat`` (Go formatting and number parsing). Imports nothing else of ``proxy``.
"""
