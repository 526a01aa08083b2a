"""The ``doc_file`` validator for the documents family (``services.domains.documents``).

``parse`` reads tables back from the PDF or HTML file, ``cite`` reads citations,
``checks`` scores an answer against the parsed file, ``judge`` is the validator.
"""
