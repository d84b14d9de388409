/* tuner-agent (docs/agent-protocol.md): the supervisor (agent.c) and the executor (executor.c). */
#ifndef TNR_AGENT_H
#define TNR_AGENT_H

#define TNR_AGENT_VERSION "0.1.0"

/* The executor: serves frames on fd until the supervisor closes it, then releases everything. */
void tnr_agent_executor(int fd);
/* The work directory (program binaries live under binaries/). */
const char *tnr_agent_work_dir(void);
/* A line on stderr, "tuner-agent[pid]: ...". */
void tnr_agent_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#endif
