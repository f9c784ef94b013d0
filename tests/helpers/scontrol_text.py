"""What SLURM 22.05's ``scontrol -o`` said on the test cluster (tests/slurmcluster's two nodes, 2 CPUs
and 8000 MB each), captured for the tests of what the notebook reads from it (test_slurm_feasibility):
a real cluster's words, read without one."""
from __future__ import annotations

# `scontrol -o show partition`: the fixture's debug (default) and urgent, and partitions made with
# `scontrol create`: small (node0 only, MaxTime=5, MaxNodes=1, MaxCPUsPerNode=1, MaxMemPerNode=1000), off (DOWN),
# gone (INACTIVE), dr (DRAIN, node1, MaxTime=1-12:00:00)
PARTITIONS = (
    'PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/'
    'A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxT'
    'ime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[0-1] PriorityJobFactor=1 Priorit'
    'yTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=UP Total'
    'CPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNo'
    'de=UNLIMITED TRES=cpu=4,mem=16000M,node=2,billing=4\n'
    'PartitionName=urgent AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/'
    'A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxT'
    'ime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[0-1] PriorityJobFactor=1 Priorit'
    'yTier=2 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=UP Total'
    'CPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNo'
    'de=UNLIMITED TRES=cpu=4,mem=16000M,node=2,billing=4\n'
    'PartitionName=small AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A'
    ' DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=1 MaxTime=00:05'
    ':00 MinNodes=1 LLN=NO MaxCPUsPerNode=1 Nodes=node0 PriorityJobFactor=1 PriorityTier=1 RootOnly=NO Re'
    'qResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=UP TotalCPUs=2 TotalNodes=1 Se'
    'lectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=1000 TRES=cpu=2,mem'
    '=8000M,node=1,billing=2\n'
    'PartitionName=off AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A D'
    'efaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime'
    '=UNLIMITED MinNodes=1 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[0-1] PriorityJobFactor=1 PriorityTi'
    'er=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=DOWN TotalC'
    'PUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNod'
    'e=UNLIMITED TRES=cpu=4,mem=16000M,node=2,billing=4\n'
    'PartitionName=gone AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A '
    'DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTim'
    'e=UNLIMITED MinNodes=1 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[0-1] PriorityJobFactor=1 PriorityT'
    'ier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=INACTIVE T'
    'otalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemP'
    'erNode=UNLIMITED TRES=cpu=4,mem=16000M,node=2,billing=4\n'
    'PartitionName=dr AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A De'
    'faultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime='
    '1-12:00:00 MinNodes=1 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node1 PriorityJobFactor=1 PriorityTier=1'
    ' RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=CANCEL State=DRAIN TotalCPUs'
    '=2 TotalNodes=1 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=U'
    'NLIMITED TRES=cpu=2,mem=8000M,node=1,billing=2\n'
)

# `scontrol -o show node`: both nodes idle
NODES = (
    'NodeName=node0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.89 AvailableFe'
    'atures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.222.202.1 NodeHostName=node0 Version=22.'
    '05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=8269 Soc'
    'kets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=de'
    'bug,urgent,small,off,gone  BootTime=2026-11-28T23:59:48 SlurmdStartTime=2026-11-29T03:27:20 LastBusy'
    'Time=2026-11-29T03:31:38 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 Av'
    'eWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
    'NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.61 AvailableFe'
    'atures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.222.202.2 NodeHostName=node1 Version=22.'
    '05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=8266 Soc'
    'kets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=de'
    'bug,urgent,off,gone,dr  BootTime=2026-11-28T23:59:48 SlurmdStartTime=2026-11-29T03:33:49 LastBusyTim'
    'e=2026-11-29T03:33:50 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWa'
    'tts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
)

# `scontrol -o show node node[0-1]` while a cancelled job still completes on node1, whose slurmd
# was SIGKILLed (squeue -t COMPLETING -o %N said node1)
COMPLETING_ON_A_SILENT_NODE = (
    'NodeName=node0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.30 AvailableFe'
    'atures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.222.202.1 NodeHostName=node0 Version=22.'
    '05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=6230 Soc'
    'kets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=de'
    'bug,urgent,small,off,gone  BootTime=2026-11-28T23:59:48 SlurmdStartTime=2026-11-29T03:27:20 LastBusy'
    'Time=2026-11-29T03:39:24 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 Av'
    'eWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
    'NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.30 AvailableFe'
    'atures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.222.202.2 NodeHostName=node1 Version=22.'
    '05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=6230 Soc'
    'kets=2 Boards=1 State=IDLE+COMPLETING+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A M'
    'CS_label=N/A Partitions=debug,urgent,off,gone,dr  BootTime=2026-11-28T23:59:48 SlurmdStartTime=2026-'
    '11-29T03:38:26 LastBusyTime=2026-11-29T03:39:18 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatt'
    's=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n'
)

# `scontrol -o show node node1` once slurmctld marked it DOWN (SlurmdTimeout)
DOWN_NODE = (
    'NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.30 AvailableFe'
    'atures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.222.202.2 NodeHostName=node1 Version=22.'
    '05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=6230 Soc'
    'kets=2 Boards=1 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/'
    'A Partitions=debug,urgent,off,gone,dr  BootTime=2026-11-28T23:59:48 SlurmdStartTime=2026-11-29T03:38'
    ':26 LastBusyTime=2026-11-29T03:39:18 CfgTRES=cpu=2,mem=8000M,billing=2 AllocTRES= CapWatts=n/a Curre'
    'ntWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=Not responding'
    ' [root@2026-11-29T03:39:38]\n'
)
