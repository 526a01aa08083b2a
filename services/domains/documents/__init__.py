"""Documents: numeric questions over multi-page PDF and HTML financial reports.

``model`` (the report as data), ``report`` (drawn from a seed), ``layout`` (pages and
the prompt's text), ``render`` (PDF and HTML bytes), ``questions`` (operands and the
reference computation), ``family`` (the domain kind).  The ``doc_file`` validator
(``services.validator.documents``) parses the rendered file back.
"""
