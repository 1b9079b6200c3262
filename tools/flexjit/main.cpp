// flexjit CLI entry point (subcommands in tools/flexjit/*.cpp).
#include <cstdio>
int main() {
  std::puts("flexjit: CLI under construction");
  return 0;
}
