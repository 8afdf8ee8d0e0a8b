package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// serverPIDs finds the control plane processes of a localcluster/ cluster: their pid
// files sit next to its admin kubeconfig. Other clusters give none (figures n/a).
func serverPIDs(kubeconfig string) map[string]int {
	out := map[string]int{}
	dir := filepath.Dir(kubeconfig)
	for _, name := range []string{"kube-apiserver", "etcd", "kube-controller-manager"} {
		data, err := os.ReadFile(filepath.Join(dir, name+".pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && filepath.Base(exe) == name {
			out[name] = pid
		}
	}
	return out
}

// machineSample is a point of the CPU accounting of the server processes and of the
// whole machine.
type machineSample struct {
	server      time.Duration // kube-apiserver + etcd + kube-controller-manager
	self        time.Duration // the benchmark (its creators and its watch)
	busy, total int64         // /proc/stat ticks, all CPUs
}

func sampleMachine(pids map[string]int) machineSample {
	var s machineSample
	for _, pid := range pids {
		if c, err := procCPU(pid); err == nil {
			s.server += c
		}
	}
	s.self, _ = procCPU(os.Getpid())
	data, err := os.ReadFile("/proc/stat")
	if err == nil {
		line := strings.SplitN(string(data), "\n", 2)[0] // "cpu  user nice system idle iowait irq softirq steal ..."
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			if i < 8 {
				s.total += n
				if i != 3 && i != 4 { // idle, iowait
					s.busy += n
				}
			}
		}
	}
	return s
}

// since returns, between two samples, the server's and the benchmark's CPU, the CPU
// time the whole machine was busy, and the busy fraction of its CPUs.
func (s machineSample) since(prev machineSample) (server, self, busyTime time.Duration, busy float64) {
	if d := s.total - prev.total; d > 0 {
		busy = float64(s.busy-prev.busy) / float64(d)
	}
	busyTime = time.Duration(s.busy-prev.busy) * time.Second / clockTicks
	return s.server - prev.server, s.self - prev.self, busyTime, busy
}
