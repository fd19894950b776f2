// gocnitool drives CNI plugins through the Go reference runtime library (libcni), so
// pycni's plugins and on-disk cache can be checked against the real thing.
//
//	gocnitool -confdir DIR -net NAME -path DIR[:DIR] -cachedir DIR \
//	          -cid ID -netns PATH -ifname IF [-args K=V;K=V] [-cap JSON] add|check|del|cached|validate|version
//
// add and cached print the result JSON on stdout; validate runs libcni's ValidateNetworkList
// (VERSION of every plugin, as podman does before using a network) and prints the
// capabilities; version prints {"type": [supported versions]} from libcni's GetVersionInfo. Any failure prints a CNI error object
// ({"code", "msg", "details"}) on stdout, the plain error on stderr, and exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func fail(err error) {
	var cniErr *types.Error
	if !errors.As(err, &cniErr) {
		cniErr = &types.Error{Code: 0, Msg: err.Error()}
	}
	data, _ := json.Marshal(cniErr)
	fmt.Println(string(data))
	fmt.Fprintln(os.Stderr, "gocnitool:", err)
	os.Exit(1)
}

func parseArgs(s string) ([][2]string, error) {
	var out [][2]string
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ";") {
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) != 2 {
			return nil, fmt.Errorf("bad -args pair %q", pair)
		}
		out = append(out, [2]string{kv[0], kv[1]})
	}
	return out, nil
}

func main() {
	confDir := flag.String("confdir", "", "directory of .conf/.conflist/.json network configs")
	netName := flag.String("net", "", "network name")
	pluginPath := flag.String("path", "", "plugin directories, ':'-separated")
	cacheDir := flag.String("cachedir", "", "libcni cache directory")
	cid := flag.String("cid", "", "container ID")
	netns := flag.String("netns", "", "container network namespace path")
	ifname := flag.String("ifname", "eth0", "interface name in the container")
	cniArgs := flag.String("args", "", "CNI_ARGS as K=V;K=V")
	capArgs := flag.String("cap", "", "capability args as a JSON object")
	flag.Parse()
	if flag.NArg() != 1 {
		fail(fmt.Errorf("one command expected (add, check, del, cached, validate, version), got %v", flag.Args()))
	}
	list, err := libcni.LoadConfList(*confDir, *netName)
	if err != nil {
		fail(err)
	}
	args, err := parseArgs(*cniArgs)
	if err != nil {
		fail(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: *cid, NetNS: *netns, IfName: *ifname, Args: args}
	if *capArgs != "" {
		if err := json.Unmarshal([]byte(*capArgs), &rt.CapabilityArgs); err != nil {
			fail(fmt.Errorf("bad -cap JSON: %w", err))
		}
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(*pluginPath), *cacheDir, nil)
	ctx := context.Background()

	var result types.Result
	switch flag.Arg(0) {
	case "add":
		result, err = cni.AddNetworkList(ctx, list, rt)
	case "check":
		err = cni.CheckNetworkList(ctx, list, rt)
	case "del":
		err = cni.DelNetworkList(ctx, list, rt)
	case "cached":
		result, err = cni.GetNetworkListCachedResult(list, rt)
		if err == nil && result == nil {
			err = fmt.Errorf("no cached result for %s/%s/%s", *netName, *cid, *ifname)
		}
	case "validate":
		var caps []string
		if caps, err = cni.ValidateNetworkList(ctx, list); err == nil {
			fmt.Println(strings.Join(caps, ","))
		}
	case "version":
		supported := map[string][]string{}
		for _, p := range list.Plugins {
			info, verr := cni.GetVersionInfo(ctx, p.Network.Type)
			if verr != nil {
				fail(verr)
			}
			supported[p.Network.Type] = info.SupportedVersions()
		}
		data, _ := json.Marshal(supported)
		fmt.Println(string(data))
	default:
		err = fmt.Errorf("unknown command %q", flag.Arg(0))
	}
	if err != nil {
		fail(err)
	}
	if result != nil {
		if err := result.Print(); err != nil {
			fail(err)
		}
		fmt.Println()
	}
}
