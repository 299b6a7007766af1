"""The job's contract: what the launcher side and the worker side of a job agree on, in one torch-free place.

A job is ``goodput launch`` (``goodput.launch``), the warm agent that may take torchrun's place
(``goodput.warm``), and the workers that run the user's script (``goodput.run``, ``goodput.warm.worker``). They
share no memory; they agree on

* exit codes (:mod:`goodput.job.codes`): what a worker's and the launcher's status mean to each other and to a
  scheduler;
* the launch folder (:mod:`goodput.job.folder`): its layout, the launch id, the markers (``FATAL``,
  ``NUMERIC``, ``STRAGGLER``, ``PREEMPTED``, pids) and torch's error files, their writers and readers, and
  which errors are a peer's reaction (``is_peer_failure``);
* the crash-loop records (:mod:`goodput.job.crashloop`): ``attempts/attempt-N.json``,
  ``attempts/attempt-N.rank-R.failed.json`` and the ``CRASH_LOOP`` verdict;
* signals and lifetimes (:mod:`goodput.job.signals`): the preemption signal's name, and that no process of the
  job outlives the launcher;
* environment variables: the one table of ``goodput._env`` (``docs/environment.md``).

Both sides import this package; it imports neither, nor torch (``tests/test_layout.py`` checks both).
"""

__all__: list[str] = []
