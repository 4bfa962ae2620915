"""What training, evaluation, ``runs``, the experiments and the benches share: the jitted programs
(``programs``), the batches they consume (``batches``), the device mesh and shardings
(``sharding``), the train state and optimiser (``state``), the run config's checks (``run_config``)
and the data as a run reads it (``data_setup``). Below the trainer and the evaluators, above the
checkpoints, the models and the data: nothing here imports ``training``, ``evaluation`` or
``experiments``."""
