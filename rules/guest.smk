# Stage 1+2 on a testbed with a `guest` block (softroce): one Soft-RoCE guest
# captures both hosts and runs every point and repetition in order, writing
# the same files capture_host and run_point write elsewhere. The analysis
# stages then run on this machine as usual.


rule guest_measure:
    output:
        PLAN.capture_paths(),
        PLAN.result_paths(),
    params:
        # already a shell command, each word quoted by Plan.guest_command (shlex.join): left unquoted here
        cmd=PLAN.guest_command(),
    resources:
        testbed=1,
    log:
        f"{RAW}/guest.log",
    shell:
        "{params.cmd} 2>&1 | tee {log:q}"
