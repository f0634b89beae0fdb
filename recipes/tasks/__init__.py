"""Task modules of the shipped recipes; each registers its builders with :func:`mmpos.runner.tasks.register_task`.

The runner imports them on demand by name (``spatial_relations`` -> :mod:`recipes.tasks.spatial`).
"""
