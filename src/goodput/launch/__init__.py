"""``goodput launch``: its configuration, the torchrun it supervises, the launch folder its workers report
into, the pre-flight checks and what it shows on the terminal. Nothing here imports torch."""

__all__: list[str] = []
