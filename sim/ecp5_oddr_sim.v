// ODDRX1F, the ECP5's output DDR register (the SDRAM clock of the ULX3S top: D0 = 1, D1 = 0),
// for both board simulations (ringkv.sim.board_harness: the RTL build with ecp5_io_sim.v, the
// gate-level build with ecp5_gate_sim.v; yosys ships only a blackbox, share/ecp5/cells_bb.v):
// D0 while SCLK is high, D1 while it is low, both registered at the rising edge. Zero delay,
// two states.
module ODDRX1F (input D0, input D1, input SCLK, input RST, output Q);
  reg q0 = 1'b0, q1 = 1'b0;
  always @(posedge SCLK) begin q0 <= D0; q1 <= D1; end
  assign Q = SCLK ? q0 : q1;
endmodule
