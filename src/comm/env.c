/* env.c - reads rank, size, local rank and the rendezvous address from the
 * conventions users already launch with: weft's own variables, torchrun,
 * Open MPI's mpirun and Slurm's srun (first complete pair wins). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/comm/bootstrap.h"
#include "src/comm/comm.h"
#include "src/base/settings.h"

/* Strict integer: the whole text, in range. */
static bool env_int(const char *text, int lo, int hi, int *out) {
  if (!text || !*text) return false;
  char *end;
  long v = strtol(text, &end, 10);
  if (*end || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

struct convention {
  const char *name;
  const char *rank, *size, *local_rank;
};

static const char *env_get(const char *name) {
  /* weft's own names go through the settings table (declared there once) */
  if (!strcmp(name, "WEFT_RANK")) return weft_setting_str(WEFT_SETTING_RANK);
  if (!strcmp(name, "WEFT_SIZE")) return weft_setting_str(WEFT_SETTING_SIZE);
  if (!strcmp(name, "WEFT_LOCAL_RANK")) return weft_setting_str(WEFT_SETTING_LOCAL_RANK);
  const char *v = getenv(name);
  return v ? v : "";
}

/* A port for single-host jobs that name no rendezvous: derived from the
 * launcher's job id, so every rank of the job computes the same one. */
static int port_from_job(const char *job) {
  unsigned h = 2166136261u;
  for (const char *p = job; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return 20000 + (int)(h % 30000);
}

weft_status weft_env_read(weft_env_job *job, char *why, size_t why_len) {
  static const struct convention conventions[] = {
      {"weft", "WEFT_RANK", "WEFT_SIZE", "WEFT_LOCAL_RANK"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  memset(job, 0, sizeof *job);
  job->local_rank = -1;
  const struct convention *use = NULL;
  for (size_t i = 0; i < sizeof conventions / sizeof conventions[0] && !use; i++) {
    const struct convention *c = &conventions[i];
    const char *r = env_get(c->rank), *s = env_get(c->size);
    if (!*r && !*s) continue;
    if (!*r || !*s) {
      snprintf(why, why_len, "%s is set but %s is not", *r ? c->rank : c->size,
               *r ? c->size : c->rank);
      return WEFT_ERR_INVALID;
    }
    if (!env_int(s, 1, 1 << 20, &job->size)) {
      snprintf(why, why_len, "%s=\"%s\" is not a world size (1 .. 1048576)", c->size, s);
      return WEFT_ERR_INVALID;
    }
    if (!env_int(r, 0, job->size - 1, &job->rank)) {
      snprintf(why, why_len, "%s=\"%s\" is not a rank in 0 .. %d", c->rank, r, job->size - 1);
      return WEFT_ERR_INVALID;
    }
    const char *lr = env_get(c->local_rank);
    if (*lr && !env_int(lr, 0, job->size - 1, &job->local_rank)) {
      snprintf(why, why_len, "%s=\"%s\" is not a local rank", c->local_rank, lr);
      return WEFT_ERR_INVALID;
    }
    use = c;
  }
  if (!use) {
    snprintf(why, why_len,
             "no rank and world size in the environment (set WEFT_RANK and WEFT_SIZE, or launch "
             "with weftrun, torchrun, mpirun or srun)");
    return WEFT_ERR_INVALID;
  }
  job->source = use->name;

  const char *rv = weft_setting_str(WEFT_SETTING_RENDEZVOUS);
  const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
  if (*rv) {
    snprintf(job->rendezvous, sizeof job->rendezvous, "%s", rv);
  } else if (ma && *ma) {
    int port = 29500; /* torchrun's default */
    if (mp && *mp && !env_int(mp, 1, 65535, &port)) {
      snprintf(why, why_len, "MASTER_PORT=\"%s\" is not a port", mp);
      return WEFT_ERR_INVALID;
    }
    /* an IPv6 literal, bare (::1) or already bracketed as in a URL ([::1]) */
    size_t n = strlen(ma);
    bool bracketed = ma[0] == '[' && n > 2 && ma[n - 1] == ']' && !strchr(ma + 1, '[') &&
                     strchr(ma, ']') == ma + n - 1;
    bool v6 = !bracketed && strchr(ma, ':') != NULL;
    if (ma[0] == '[' && !bracketed) {
      snprintf(why, why_len, "MASTER_ADDR=\"%s\" is not an address ([ without a closing ])", ma);
      return WEFT_ERR_INVALID;
    }
    snprintf(job->rendezvous, sizeof job->rendezvous, "%s%s%s:%d", v6 ? "[" : "", ma,
             v6 ? "]" : "", port);
  } else if (job->size > 1) {
    /* mpirun/srun on one host: loopback and a port from the job id */
    const char *local_size = getenv(!strcmp(use->name, "mpirun") ? "OMPI_COMM_WORLD_LOCAL_SIZE"
                                                                 : "SLURM_NTASKS_PER_NODE");
    const char *nnodes = getenv("SLURM_JOB_NUM_NODES");
    const char *jobid = getenv(!strcmp(use->name, "mpirun") ? "OMPI_MCA_ess_base_jobid"
                                                            : "SLURM_JOB_ID");
    int ls = 0, nn = 0;
    bool one_host = (local_size && env_int(local_size, 1, 1 << 20, &ls) && ls == job->size) ||
                    (!strcmp(use->name, "srun") && nnodes && env_int(nnodes, 1, 1 << 20, &nn) &&
                     nn == 1);
    if (!one_host || !jobid) {
      snprintf(why, why_len,
               "no rendezvous address: set WEFT_RENDEZVOUS=host:port (rank 0's host) or "
               "MASTER_ADDR and MASTER_PORT");
      return WEFT_ERR_INVALID;
    }
    char job_key[128];
    snprintf(job_key, sizeof job_key, "%s.%s", jobid, getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "");
    snprintf(job->rendezvous, sizeof job->rendezvous, "127.0.0.1:%d", port_from_job(job_key));
  }
  return WEFT_OK;
}

void weft_env_job_id(char *out, size_t len) {
  /* innermost launcher first: weftrun or torchrun started inside a Slurm
   * allocation or under mpirun name the job the ranks belong to */
  static const char *const names[] = {"TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid",
                                      "PMIX_NAMESPACE"};
  const char *own = weft_setting_str(WEFT_SETTING_JOB_ID);
  if (*own) {
    snprintf(out, len, "WEFT_JOB_ID=%s", own);
    return;
  }
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    /* torchrun without --rdzv-id (and not --standalone) says "none" on every job */
    if (v && *v && strcmp(v, "none") != 0) {
      snprintf(out, len, "%s=%s", names[i], v);
      return;
    }
  }
  const char *slurm_job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  if (slurm_job && *slurm_job) {
    snprintf(out, len, "SLURM_JOB_ID=%s.%s", slurm_job, step && *step ? step : "");
    return;
  }
  if (len) out[0] = 0;
}
