"""``temper report``: a run directory as one self-contained HTML page, or markdown tables.

``run_data`` reads the run, ``sections`` and ``system_sections`` turn it into a
``document``, ``html`` and ``markdown`` render that.  Nothing is imported here, so that
``services.evaluation.watch`` can read ``run_data`` without a cycle.
"""
