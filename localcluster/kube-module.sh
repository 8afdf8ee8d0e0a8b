# Sourced by build.sh and node-build.sh: the scratch module that builds Kubernetes'
# commands from the Go module proxy.
#
# Why a scratch module: kubernetes' own go.mod replaces every staging module with
# ./staging/src/k8s.io/<name>, so `go install k8s.io/kubernetes/cmd/X@version` refuses
# it. A module that requires k8s.io/kubernetes and replaces each of those staging
# modules with its published version (v0.<minor>.<patch>) builds.

# kube_module DIR VERSION: writes DIR/go.mod for k8s.io/kubernetes at VERSION.
kube_module() {
  local d=$1 version=$2
  local stag="v0.${version#v1.}"
  local modfile goline
  modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  goline=$(grep -m1 '^go ' "$modfile")
  {
    echo "module luaop.local/kubebuild"
    echo
    echo "$goline"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    # sample-cli-plugin and sample-controller are refused by the proxy at v0.x and
    # kubernetes does not require them.
    grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$modfile" | awk '{print $1}' \
      | grep -v -E 'k8s.io/(sample-cli-plugin|sample-controller)$' \
      | while read -r m; do echo "replace $m => $m $stag"; done
  } > "$d/go.mod"
}

# kube_ldflags VERSION: the -ldflags that make the binaries report VERSION (without
# them they say v0.0.0 and clients complain about the skew).
kube_ldflags() {
  local version=$1 minor
  minor="${version#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  echo "$ld"
}
