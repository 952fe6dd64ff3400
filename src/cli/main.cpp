#include <cstdio>
int main() { std::puts("lragent"); return 0; }
