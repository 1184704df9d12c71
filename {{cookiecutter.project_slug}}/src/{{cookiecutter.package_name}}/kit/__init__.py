"""The training kit: everything around your model and data that makes a run fast,
observable and safe. It is the same text in every project made from the template,
imports nothing of yours, and works with any LightningModule and
LightningDataModule that the `Project` passed in names (spec.py); you should
rarely need to edit it.

Two layers, imports running one way (tests/kit/test_imports.py holds them):

    tools      doctor  memory  collectives  bench  export  export_flags  folder  sweep
               trial  repeat  stopping
                 |  each a command of its own, built on the core
                 v
    run core   cli (fit, validate, test, predict) and what it imports: spec,
               callbacks, console, watch, checkpoints, runs, resume, sharding, data,
               draws, shards, unfrozen, schedules, health, peaks, footprint, hardware,
               hints, predict, machine, internals

The core never imports a tool, nor Optuna, ONNX or safetensors: a fit loads none of them, and
sharding and hints only for an FSDP run and a failure.

    spec         Project: everything the kit may ask of your code, each with its default;
                 the `--fsdp.*` options
    cli          the Lightning CLI with the kit's callbacks and the project's defaults
    callbacks    the environment report, the context the error hints keep, the kit's
                 callbacks as one
    console      train/loss once a logging window, the progress bar, the model summary
    watch        a diverged run stops before it saves; a job whose ranks stop meeting
                 ends in seconds, naming the rank
    checkpoints  best and last, `--ckpt_path last`, interrupted.ckpt, the file check
    runs         one run directory per run, continued on resume; the line a fit ends with
    resume       the random states and data position a checkpoint carries: resumes exact
    sharding     FSDP2 for any network, sharded checkpoints written whole, joined for export
    data         loader settings from the machine, a DataModule built from splits,
                 resumable orders: one permutation dealt out, your batch sampler dealt
                 out, a stream told its epoch
    draws        the random draws of the data keyed by sample, epoch and worker
    shards       each rank trains its own share, or the fit stops in one line
    unfrozen     weights unfrozen after DDP wrapped the model, averaged over the ranks
    schedules    a schedule of a fixed length and a fit that would step past it
    health       throughput, data wait, FLOPs and MFU, memory at the end of fit
    peaks        the peak FLOP/s of current GPUs
    footprint    weights, gradients and optimizer state per rank, under DDP and FSDP
    hardware     precision and matmul kernels from the accelerator the run uses
    hints        what the classic errors mean, printed after a traceback; the errors of
                 the input that need one line and no traceback
    predict      `predict` writes any predict_step output as CSV rows
    machine      the torch build and the GPUs, for the doctor and the report
    internals    every private name of Lightning, torch and Optuna the kit uses
    export       `export`: the trained network, loadable without the checkpoint
    export_flags `export`'s flags, which answer `--help` without torch or Lightning
    folder       `export --output DIR/`: safetensors, config.json and a model card
    sweep        `sweep`: an Optuna study over fit's flags, its storage and workers
    trial        one trial of a sweep: a fit with its flags, pruned on the metric
    repeat       `repeat`: one fit over several seeds or folds, its metric's mean and spread
    bench        `bench`: the loader, the step and the loop timed apart, and a verdict
    stopping     what a sweep and its trials share: their errors, the stop signal
    doctor       `doctor`: is this machine ready to train (never imports Lightning)
    memory       `doctor --memory`: a step's activations, and whether a run fits per rank
    collectives  `doctor --distributed`: can local ranks form a group, and what in the
                 environment breaks one
"""

# The template release this kit is the text of (the template's CHANGELOG.md).
KIT_VERSION = "0.2.0"
