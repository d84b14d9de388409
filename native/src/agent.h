/* tuner-agent (docs/agent-protocol.md): the supervisor (agent.c) and the executor (executor.c). The executor
 * depends on nothing of the supervisor's: what it needs comes as arguments (issue 54, item 8). */
#ifndef TNR_AGENT_H
#define TNR_AGENT_H

#define TNR_AGENT_VERSION "0.1.0"

/* The executor: serves frames on fd until the supervisor closes it, then releases everything. work_dir: the
 * work folder (program binaries live under binaries/). It is handed no token and reads no supervisor state. */
void tnr_agent_executor(int fd, const char *work_dir);

#endif
