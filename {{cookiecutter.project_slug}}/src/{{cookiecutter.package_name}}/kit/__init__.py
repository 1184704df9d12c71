"""The training kit: everything around your model and data that makes a run fast,
observable and safe. It works with any LightningModule and LightningDataModule
that `{{ cookiecutter.package_name }}.project` names; you should rarely need to edit it.

    cli          the Lightning CLI with this project's callbacks and defaults
    callbacks    the environment report and the context the error hints quote
    checkpoints  best and last, `--ckpt_path last`, interrupted.ckpt, the file check
    data         loader settings from the machine, a DataModule built from splits
    doctor       `doctor`: is this machine ready to train (never imports Lightning)
    export       `export`: the trained network, loadable without the checkpoint
    hardware     precision and matmul kernels from the accelerator the run uses
    health       throughput, data wait and memory at the end of fit
    hints        what the classic errors mean, printed after a traceback
    predict      `predict` writes any predict_step output as CSV rows
    sweep        `sweep`: an Optuna study over fit's flags, its storage and workers
    trial        one trial of a sweep: a fit with its flags, pruned on the metric
"""
