"""``goodput launch``: its configuration, the torchrun it supervises, what it reads from the launch folder
(``goodput.job.folder``), the pre-flight checks and what it shows on the terminal. Nothing here imports torch."""

__all__: list[str] = []
